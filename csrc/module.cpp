// bertfast._C: the native kernels' Python module, bound through pybind11.
//
// The tensor entry points are torch operators that loading this module registers
// (csrc/cpu_ops.cpp, csrc/cpu_int8_ops.cpp and, when nvcc was found at build time,
// csrc/cuda/cuda_ops.cpp: torch.ops.bertfast_cpu.* and torch.ops.bertfast_cuda.*),
// through the LibTorch stable ABI, so the module loads with every torch from its
// target version on. The init below puts each operator on _C.cpu / _C.cuda
// (bertfast/_operators.py).
// Here, with no torch header: what the build contains, the constants of
// kernels/constants.h, and the backends' tensor-free functions (csrc/registry.h).
//
// torch's headers before 2.13 refuse pybind11 when TORCH_TARGET_VERSION is defined
// (CMakeLists.txt defines it for every file); nothing here uses torch.
#pragma push_macro("TORCH_TARGET_VERSION")
#undef TORCH_TARGET_VERSION
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#pragma pop_macro("TORCH_TARGET_VERSION")

#include <iterator>
#include <optional>
#include <string>

#include "constants.h"
#include "cpu/kernels.h"
#include "registry.h"

namespace py = pybind11;

#ifndef BERTFAST_CXX_COMPILER
#define BERTFAST_CXX_COMPILER "unknown"
#endif
#ifndef BERTFAST_CUDA_STATUS
#define BERTFAST_CUDA_STATUS "unknown"
#endif
#ifndef BERTFAST_TORCH_MIN
#define BERTFAST_TORCH_MIN "unknown"
#endif
#ifndef BERTFAST_TORCH_BUILT
#define BERTFAST_TORCH_BUILT "unknown"
#endif

namespace {

py::dict build_info() {
  py::dict info;
  info["cxx_compiler"] = BERTFAST_CXX_COMPILER;
  info["cuda_status"] = BERTFAST_CUDA_STATUS;
  // The oldest torch this build loads with (its stable-ABI target) and the torch whose
  // headers it was compiled with.
  info["torch_min"] = BERTFAST_TORCH_MIN;
  info["torch_built"] = BERTFAST_TORCH_BUILT;
#ifdef BERTFAST_WITH_OPENMP
  info["openmp"] = true;
#else
  info["openmp"] = false;
#endif
#ifdef BERTFAST_WITH_CUDA
  info["cuda"] = true;
  info["cuda_version"] = BERTFAST_CUDA_VERSION;
  info["cuda_archs"] = BERTFAST_CUDA_ARCHS;
#else
  info["cuda"] = false;
  info["cuda_version"] = py::none();
  info["cuda_archs"] = "";
#endif
  return info;
}

template <typename Names>
py::tuple names(const Names& list) {
  py::tuple t(std::size(list));
  for (size_t i = 0; i < std::size(list); ++i) t[i] = py::str(list[i]);
  return t;
}

template <int... V>
py::tuple values(bertfast::IntList<V...>) {
  return py::make_tuple(V...);
}

py::dict constants() {
  using namespace bertfast;
  py::dict c;
  c["dtypes"] = names(kDTypeNames);            // code = index
  c["activations"] = names(kActivationNames);  // code = index
  c["no_activation"] = static_cast<int>(kNoActivation);
  c["cuda_attention_head_dims"] = values(CudaAttentionHeadDims{});
  c["cuda_flash_attention_head_dims"] = values(CudaFlashAttentionHeadDims{});
  c["max_layernorm_width"] = kMaxLayerNormWidth;
  c["max_grid_yz"] = kMaxGridYZ;
  c["max_cuda_seqlen"] = kMaxCudaSeqLen;
  c["max_cuda_rows"] = kMaxCudaRows;
  return c;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "bertfast native kernels (C++ CPU and CUDA C++)";
  m.def("build_info", &build_info,
        "What this build contains: C++ compiler, OpenMP, CUDA version and architectures.");
  m.def("constants", &constants,
        "dtype and activation codes, CUDA head dims and size limits (kernels/constants.h)");
  using py::arg;
  auto cpu = m.def_submodule("cpu",
                             "C++ CPU kernels (kernels/cpu/); see bertfast/ops/cpu/__init__.py and "
                             "bertfast/ops/native.py");
  cpu.def("linear_panel_width", &bertfast::cpu::linear_panel_width,
          "columns per packed weight panel of the GEMM this CPU runs (32 AVX-512, 16 AVX2)",
          arg("allow_avx512") = true);
  cpu.def(
      "int8_isa",
      [](const std::optional<std::string>& isa) {
        try {
          return bertfast::cpu_int8_isa(isa);
        } catch (const std::invalid_argument& e) {  // "ValueError: <message>"
          const std::string msg = e.what(), tag = "ValueError: ";
          throw py::value_error(msg.rfind(tag, 0) == 0 ? msg.substr(tag.size()) : msg);
        }
      },
      "the int8 micro-kernel a call with this isa runs: 'amx', 'vnni' or 'avx2' (None reads "
      "BERTFAST_CPU_INT8_ISA; ValueError for a name this CPU cannot run)",
      arg("isa") = py::none());
  cpu.def("step_profile_start", &bertfast::step_profile_start,
          "clear the step profile and turn it on: from now each innermost step of "
          "encoder_forward / encoder_layer (and their int8 forms) adds its wall time "
          "to its name's total (csrc/step_profile.cpp)");
  cpu.def(
      "step_profile_stop",
      [] {
        py::list out;
        for (const auto& s : bertfast::step_profile_stop())
          out.append(py::make_tuple(s.name, s.seconds, s.calls));
        return out;
      },
      "turn the step profile off; its totals as [(step name, seconds, calls)], in the "
      "order the steps first ran");
#ifdef BERTFAST_WITH_CUDA
  auto cuda = m.def_submodule(
      "cuda",
      "CUDA C++ kernels (kernels/cuda/); see bertfast/ops/cuda.py and bertfast/ops/native.py");
  cuda.def("device_count", &bertfast::cuda_device_count,
           "CUDA devices the runtime sees, or -cudaError_t when none is usable");
  cuda.def("error_name", &bertfast::cuda_error_name, "Name of a cudaError_t code", arg("code"));
#endif
  // The operators (registered when this library was loaded) as functions of _C.cpu / _C.cuda.
  auto attach = py::module_::import("bertfast._operators").attr("attach");
  attach(cpu, "bertfast_cpu");
#ifdef BERTFAST_WITH_CUDA
  attach(cuda, "bertfast_cuda");
#endif
}
