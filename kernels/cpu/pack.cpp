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

}  // namespace cpu
}  // namespace bertfast
