// pack_rows / unpack_rows: gather real tokens into a packed tensor and scatter
// them back (zeros at the other rows). Rows are opaque byte strings of
// `row_bytes` (any dtype, any trailing shape).
//
//   pack_rows:   out[i] = x[indices[i]]        out [num_indices, row], x [src_rows, row]
//   unpack_rows: out[indices[i]] = x[i], zero rows elsewhere; out [num_rows, row]
//
// Indices are validated here first (std::out_of_range -> IndexError in Python),
// so no out-of-bounds access happens whatever the caller checked. Threads:
// OpenMP static split over rows, one memcpy per row.
//
// scan_inputs / scan_indices: a forward's inputs read once on the host (the model's
// value checks and where its real tokens are, without a torch op per value): ids'
// min and max, token types' and positions' when given, each row's real-token count
// (nonzero mask entries) as cu_seqlens, and the flat positions of the real tokens.
#include <vector>

#include "cpu/common.h"
#include "cpu/kernels.h"

namespace bertfast {
namespace cpu {
namespace {

void check_indices(const int64_t* indices, int64_t n, int64_t limit, const char* op) {
  for (int64_t i = 0; i < n; ++i) {
    if (indices[i] < 0 || indices[i] >= limit)
      throw std::out_of_range(std::string("bertfast._C.cpu.") + op + ": index " +
                              std::to_string(indices[i]) + " outside [0, " + std::to_string(limit) +
                              ")");
  }
}

}  // namespace

void pack_rows(void* out, const void* x, const int64_t* indices, int64_t num_indices,
               int64_t src_rows, int64_t row_bytes, int num_threads) {
  check_indices(indices, num_indices, src_rows, "pack_rows");
  if (num_indices <= 0 || row_bytes <= 0) return;
  char* o = static_cast<char*>(out);
  const char* s = static_cast<const char*>(x);
  const int nt = threads_for(num_indices * row_bytes, 1 << 18, num_threads);
#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
  for (int64_t i = 0; i < num_indices; ++i)
    std::memcpy(o + i * row_bytes, s + indices[i] * row_bytes, row_bytes);
}

void unpack_rows(void* out, const void* x, const int64_t* indices, int64_t num_indices,
                 int64_t num_rows, int64_t row_bytes, int num_threads) {
  check_indices(indices, num_indices, num_rows, "unpack_rows");
  if (num_rows <= 0 || row_bytes <= 0) return;
  std::vector<unsigned char> covered(num_rows, 0);
  for (int64_t i = 0; i < num_indices; ++i) covered[indices[i]] = 1;
  char* o = static_cast<char*>(out);
  const char* s = static_cast<const char*>(x);
  const int nt = threads_for(num_rows * row_bytes, 1 << 18, num_threads);
#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel num_threads(nt)
#endif
  {
#ifdef BERTFAST_WITH_OPENMP
#pragma omp for schedule(static) nowait
#endif
    for (int64_t r = 0; r < num_rows; ++r)
      if (!covered[r]) std::memset(o + r * row_bytes, 0, row_bytes);
    // Duplicate indices: the last writer wins, as with index_copy_ on CPU
    // (serial order is not guaranteed there either).
#ifdef BERTFAST_WITH_OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t i = 0; i < num_indices; ++i)
      std::memcpy(o + indices[i] * row_bytes, s + i * row_bytes, row_bytes);
  }
}

namespace {

// min / max of n int64 values into stats[0], stats[1].
void min_max(const int64_t* x, int64_t n, int64_t* stats) {
  int64_t lo = x[0], hi = x[0];
  for (int64_t i = 1; i < n; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  stats[0] = lo;
  stats[1] = hi;
}

template <typename M>
void count_rows(const M* mask, int64_t batch, int64_t seqlen, int32_t* cu, int64_t* stats) {
  int64_t total = 0, longest = 0;
  cu[0] = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const M* row = mask + b * seqlen;
    int64_t n = 0;
    for (int64_t s = 0; s < seqlen; ++s) n += row[s] != 0;
    total += n;
    longest = n > longest ? n : longest;
    cu[b + 1] = static_cast<int32_t>(total);
  }
  stats[0] = total;
  stats[1] = longest;
}

template <typename M>
void real_positions(const M* mask, int64_t count, int64_t* indices, int64_t total) {
  int64_t t = 0;
  for (int64_t i = 0; i < count && t < total; ++i)
    if (mask[i] != 0) indices[t++] = i;
}

}  // namespace

void scan_inputs(int64_t* stats, int32_t* cu_seqlens, const int64_t* input_ids, const void* mask,
                 int mask_kind, const int64_t* token_type_ids, const int64_t* position_ids,
                 int64_t batch, int64_t seqlen) {
  const int64_t count = batch * seqlen;
  for (int i = 0; i < kScanStats; ++i) stats[i] = 0;
  if (count <= 0) {
    for (int64_t b = 0; b <= batch; ++b) cu_seqlens[b] = 0;
    return;
  }
  min_max(input_ids, count, stats);
  if (token_type_ids) min_max(token_type_ids, count, stats + 2);
  if (position_ids) min_max(position_ids, count, stats + 4);
  if (mask_kind == kScanMaskInt64) {
    count_rows(static_cast<const int64_t*>(mask), batch, seqlen, cu_seqlens, stats + 6);
  } else if (mask_kind == kScanMaskInt32) {
    count_rows(static_cast<const int32_t*>(mask), batch, seqlen, cu_seqlens, stats + 6);
  } else if (mask_kind == kScanMaskBool) {
    count_rows(static_cast<const uint8_t*>(mask), batch, seqlen, cu_seqlens, stats + 6);
  } else {  // no mask: every position is real
    for (int64_t b = 0; b <= batch; ++b) cu_seqlens[b] = static_cast<int32_t>(b * seqlen);
    stats[6] = count;
    stats[7] = seqlen;
  }
}

void scan_indices(int64_t* indices, int64_t total, const void* mask, int mask_kind, int64_t count) {
  if (mask_kind == kScanMaskInt64) {
    real_positions(static_cast<const int64_t*>(mask), count, indices, total);
  } else if (mask_kind == kScanMaskInt32) {
    real_positions(static_cast<const int32_t*>(mask), count, indices, total);
  } else if (mask_kind == kScanMaskBool) {
    real_positions(static_cast<const uint8_t*>(mask), count, indices, total);
  } else {
    for (int64_t i = 0; i < total; ++i) indices[i] = i;
  }
}

}  // namespace cpu
}  // namespace bertfast
