// pack_tokens / unpack_tokens: row gather and scatter.
//
//   pack:   out[t] = x[indices[t]]                 (t < num_indices)
//   unpack: out = 0; out[indices[t]] = x[t]        (zero rows where no index points)
//
// Rows are opaque bytes (row_bytes each); copies use the widest unit (16, 8, 4, 2
// or 1 bytes) that divides the row size and both base pointers' alignment.
// An index out of range never reads or writes out of bounds: pack writes a zero
// row, unpack skips it (the op boundary already rejects such indices).
// Launch: 128-thread blocks, one warp per row, grid-stride over rows.
#include <cstdint>

#include "common.cuh"
#include "launchers.cuh"

namespace bertfast {
namespace cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarpsPerBlock = kThreads / 32;

// PACK:   out[t] = x[indices[t]], a zero row where indices[t] is outside [0, bound_rows).
// UNPACK: out[indices[t]] = x[t], skipped where indices[t] is outside [0, bound_rows).
template <bool PACK, typename U>
__global__ void move_rows_kernel(U* __restrict__ out, const U* __restrict__ x,
                                 const int64_t* __restrict__ indices, int64_t num_indices,
                                 int64_t bound_rows, int64_t row_units) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
       t < num_indices; t += warps) {
    const int64_t index = indices[t];
    if (index < 0 || index >= bound_rows) {
      if (PACK)
        for (int64_t k = lane; k < row_units; k += 32) out[t * row_units + k] = U{};
      continue;
    }
    U* dst_row = out + (PACK ? t : index) * row_units;
    const U* src_row = x + (PACK ? index : t) * row_units;
    for (int64_t k = lane; k < row_units; k += 32) dst_row[k] = src_row[k];
  }
}

// Widest copy unit in bytes dividing the row size and both pointers' alignment.
int copy_unit(const void* a, const void* b, int64_t row_bytes) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                         static_cast<uintptr_t>(row_bytes);
  for (int unit = 16; unit > 1; unit >>= 1)
    if ((bits & static_cast<uintptr_t>(unit - 1)) == 0) return unit;
  return 1;
}

unsigned grid_for(int64_t rows) {
  int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 65535 * 16) blocks = 65535 * 16;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks);
}

template <bool PACK, typename U>
cudaError_t launch_rows(void* out, const void* x, const int64_t* indices, int64_t num_indices,
                        int64_t bound_rows, int64_t row_bytes, cudaStream_t stream) {
  const int64_t row_units = row_bytes / static_cast<int64_t>(sizeof(U));
  move_rows_kernel<PACK, U><<<grid_for(num_indices), kThreads, 0, stream>>>(
      static_cast<U*>(out), static_cast<const U*>(x), indices, num_indices, bound_rows, row_units);
  return cudaGetLastError();
}

template <bool PACK>
cudaError_t launch_by_unit(void* out, const void* x, const int64_t* indices, int64_t num_indices,
                           int64_t bound_rows, int64_t row_bytes, cudaStream_t stream) {
  switch (copy_unit(out, x, row_bytes)) {
    case 16:
      return launch_rows<PACK, uint4>(out, x, indices, num_indices, bound_rows, row_bytes, stream);
    case 8:
      return launch_rows<PACK, uint2>(out, x, indices, num_indices, bound_rows, row_bytes, stream);
    case 4:
      return launch_rows<PACK, uint32_t>(out, x, indices, num_indices, bound_rows, row_bytes,
                                         stream);
    case 2:
      return launch_rows<PACK, uint16_t>(out, x, indices, num_indices, bound_rows, row_bytes,
                                         stream);
    default:
      return launch_rows<PACK, uint8_t>(out, x, indices, num_indices, bound_rows, row_bytes,
                                        stream);
  }
}

}  // namespace

cudaError_t launch_pack_rows(void* out, const void* x, const int64_t* indices, int64_t num_indices,
                             int64_t num_src_rows, int64_t row_bytes, cudaStream_t stream) {
  if (num_indices < 0 || row_bytes < 0) return cudaErrorInvalidValue;
  if (num_indices == 0 || row_bytes == 0) return cudaSuccess;
  return launch_by_unit<true>(out, x, indices, num_indices, num_src_rows, row_bytes, stream);
}

cudaError_t launch_unpack_rows(void* out, const void* x, const int64_t* indices,
                               int64_t num_indices, int64_t num_out_rows, int64_t row_bytes,
                               cudaStream_t stream) {
  if (num_indices < 0 || num_out_rows < 0 || row_bytes < 0) return cudaErrorInvalidValue;
  if (num_out_rows == 0 || row_bytes == 0) return cudaSuccess;
  cudaError_t err = cudaMemsetAsync(out, 0, static_cast<size_t>(num_out_rows * row_bytes), stream);
  if (err != cudaSuccess) return err;
  if (num_indices == 0) return cudaSuccess;
  return launch_by_unit<false>(out, x, indices, num_indices, num_out_rows, row_bytes, stream);
}

}  // namespace cuda
}  // namespace bertfast
