// pybind11 bindings of the CUDA kernels in kernels/cuda/ (compiled only when
// nvcc is found).
#include <cuda_runtime.h>

#include "registry.h"

namespace bertfast {

// Number of CUDA devices the runtime sees, or a negative cudaError_t code when
// there is no usable driver/device (so Python can say why, without crashing).
static int cuda_device_count() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return -static_cast<int>(err);
  }
  return n;
}

void register_cuda_ops(pybind11::module_& m) {
  m.def("cuda_device_count", &cuda_device_count,
        "CUDA devices visible to bertfast's runtime (negative: -cudaError_t)");
}

}  // namespace bertfast
