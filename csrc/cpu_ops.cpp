// pybind11 bindings of the CPU kernels in kernels/cpu/.
//
// Every function takes raw addresses (tensor.data_ptr() from bertfast/ops/cpu.py,
// which has made the tensors contiguous and allocated the outputs), sizes, a
// dtype code and torch.get_num_threads(); the GIL is released while a kernel runs.
// Null pointers (0) mean "absent" for optional tensors.
#include <cstdint>

#include "registry.h"  // pybind11 first: common.h turns off trapping math after it

#include "cpu/common.h"

namespace py = pybind11;

namespace bertfast {
namespace {

template <typename T = void>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

void embed_layernorm(int dtype, uintptr_t out, uintptr_t input_ids, uintptr_t position_ids,
                     uintptr_t token_type_ids, uintptr_t word, int64_t vocab, uintptr_t pos,
                     int64_t num_pos, uintptr_t types, int64_t num_types, uintptr_t weight,
                     uintptr_t bias, int64_t tokens, int64_t width, double eps, int num_threads) {
  cpu::embed_layernorm(dtype, ptr(out), ptr<const int64_t>(input_ids),
                       ptr<const int64_t>(position_ids), ptr<const int64_t>(token_type_ids),
                       ptr(word), vocab, ptr(pos), num_pos, ptr(types), num_types, ptr(weight),
                       ptr(bias), tokens, width, static_cast<float>(eps), num_threads);
}

void add_layernorm(int dtype, uintptr_t out, uintptr_t x, uintptr_t residual, uintptr_t bias,
                   uintptr_t weight, uintptr_t ln_bias, int64_t rows, int64_t hidden, double eps,
                   int num_threads) {
  cpu::add_layernorm(dtype, ptr(out), ptr(x), ptr(residual), ptr(bias), ptr(weight),
                     ptr(ln_bias), rows, hidden, static_cast<float>(eps), num_threads);
}

void bias_act(int dtype, uintptr_t out, uintptr_t x, uintptr_t bias, int64_t rows, int64_t cols,
              int activation, int num_threads) {
  cpu::bias_act(dtype, ptr(out), ptr(x), ptr(bias), rows, cols, activation, num_threads);
}

void attention(int dtype, uintptr_t out, uintptr_t qkv, uintptr_t mask, int64_t batch,
               int64_t seqlen, int64_t num_heads, int64_t hidden, double scale,
               int num_threads) {
  cpu::attention_padded(dtype, ptr(out), ptr(qkv), ptr<const uint8_t>(mask), batch, seqlen,
                        num_heads, hidden, static_cast<float>(scale), num_threads);
}

void attention_varlen(int dtype, uintptr_t out, uintptr_t qkv, uintptr_t cu_seqlens,
                      int64_t batch, int64_t tokens, int64_t num_heads, int64_t hidden,
                      double scale, int num_threads) {
  cpu::attention_varlen(dtype, ptr(out), ptr(qkv), ptr<const int32_t>(cu_seqlens), batch,
                        tokens, num_heads, hidden, static_cast<float>(scale), num_threads);
}

void linear_act(uintptr_t out, uintptr_t x, uintptr_t weight, uintptr_t bias, int64_t M,
                int64_t N, int64_t K, int activation, bool allow_avx512, int num_threads) {
  cpu::linear_act(ptr(out), ptr(x), ptr(weight), ptr(bias), M, N, K, activation, allow_avx512,
                  num_threads);
}

void linear_pack(uintptr_t packed, uintptr_t weight, int64_t N, int64_t K, bool allow_avx512,
                 int num_threads) {
  cpu::linear_pack(ptr(packed), ptr(weight), N, K, allow_avx512, num_threads);
}

void linear_packed(uintptr_t out, uintptr_t x, uintptr_t packed, uintptr_t bias, int64_t M,
                   int64_t N, int64_t K, int activation, bool allow_avx512, int num_threads) {
  cpu::linear_packed(ptr(out), ptr(x), ptr(packed), ptr(bias), M, N, K, activation,
                     allow_avx512, num_threads);
}

void pack_rows(uintptr_t out, uintptr_t x, uintptr_t indices, int64_t num_indices,
               int64_t src_rows, int64_t row_bytes, int num_threads) {
  cpu::pack_rows(ptr(out), ptr(x), ptr<const int64_t>(indices), num_indices, src_rows,
                 row_bytes, num_threads);
}

void unpack_rows(uintptr_t out, uintptr_t x, uintptr_t indices, int64_t num_indices,
                 int64_t num_rows, int64_t row_bytes, int num_threads) {
  cpu::unpack_rows(ptr(out), ptr(x), ptr<const int64_t>(indices), num_indices, num_rows,
                   row_bytes, num_threads);
}

}  // namespace

void register_cpu_ops(pybind11::module_& m) {
  auto cpu = m.def_submodule("cpu", "C++ CPU kernels (kernels/cpu/); see bertfast/ops/cpu.py");
  using release = py::call_guard<py::gil_scoped_release>;
  cpu.def("embed_layernorm", &embed_layernorm, release(),
          "out[t] = LayerNorm(word[ids[t]] + types[tt[t]] + pos[p[t]]); NaN row for an id out of range",
          py::arg("dtype"), py::arg("out"), py::arg("input_ids"), py::arg("position_ids"),
          py::arg("token_type_ids"), py::arg("word"), py::arg("vocab"), py::arg("pos"),
          py::arg("num_pos"), py::arg("types"), py::arg("num_types"), py::arg("weight"),
          py::arg("bias"), py::arg("tokens"), py::arg("width"), py::arg("eps"),
          py::arg("num_threads"));
  cpu.def("add_layernorm", &add_layernorm, release(),
          "out = LayerNorm((x + bias) + residual) over rows of `hidden`", py::arg("dtype"),
          py::arg("out"), py::arg("x"), py::arg("residual"), py::arg("bias"), py::arg("weight"),
          py::arg("ln_bias"), py::arg("rows"), py::arg("hidden"), py::arg("eps"),
          py::arg("num_threads"));
  cpu.def("bias_act", &bias_act, release(),
          "out = act(x + bias) over [rows, cols]; out may equal x; act 0 gelu, 1 gelu_tanh, 2 relu",
          py::arg("dtype"), py::arg("out"), py::arg("x"), py::arg("bias"), py::arg("rows"),
          py::arg("cols"), py::arg("activation"), py::arg("num_threads"));
  cpu.def("attention", &attention, release(),
          "padded attention over qkv [B, S, 3H] with key-padding mask [B, S] (uint8) -> [B, S, H]",
          py::arg("dtype"), py::arg("out"), py::arg("qkv"), py::arg("mask"), py::arg("batch"),
          py::arg("seqlen"), py::arg("num_heads"), py::arg("hidden"), py::arg("scale"),
          py::arg("num_threads"));
  cpu.def("attention_varlen", &attention_varlen, release(),
          "packed attention over qkv [T, 3H] with cu_seqlens [B + 1] (int32) -> [T, H]",
          py::arg("dtype"), py::arg("out"), py::arg("qkv"), py::arg("cu_seqlens"),
          py::arg("batch"), py::arg("tokens"), py::arg("num_heads"), py::arg("hidden"),
          py::arg("scale"), py::arg("num_threads"));
  cpu.def("linear_act", &linear_act, release(),
          "fp32 out[M, N] = act(x[M, K] @ weight[N, K]^T + bias); act -1 none, 0 gelu, 1 gelu_tanh, "
          "2 relu; allow_avx512=False forces the AVX2 kernel",
          py::arg("out"), py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("M"),
          py::arg("N"), py::arg("K"), py::arg("activation"), py::arg("allow_avx512") = true,
          py::arg("num_threads") = 1);
  cpu.def("linear_panel_width", &cpu::linear_panel_width,
          "columns per packed weight panel of the GEMM this CPU runs (32 AVX-512, 16 AVX2)",
          py::arg("allow_avx512") = true);
  cpu.def("linear_pack", &linear_pack, release(),
          "pack weight [N, K] into ceil(N / panel_width) * panel_width * K floats",
          py::arg("packed"), py::arg("weight"), py::arg("N"), py::arg("K"),
          py::arg("allow_avx512") = true, py::arg("num_threads") = 1);
  cpu.def("linear_packed", &linear_packed, release(),
          "linear_act with a weight packed by linear_pack (same allow_avx512)", py::arg("out"),
          py::arg("x"), py::arg("packed"), py::arg("bias"), py::arg("M"), py::arg("N"),
          py::arg("K"), py::arg("activation"), py::arg("allow_avx512") = true,
          py::arg("num_threads") = 1);
  cpu.def("pack_rows", &pack_rows, release(), "out[i] = x[indices[i]] (rows of row_bytes)",
          py::arg("out"), py::arg("x"), py::arg("indices"), py::arg("num_indices"),
          py::arg("src_rows"), py::arg("row_bytes"), py::arg("num_threads"));
  cpu.def("unpack_rows", &unpack_rows, release(),
          "out[indices[i]] = x[i], zero rows elsewhere (rows of row_bytes)", py::arg("out"),
          py::arg("x"), py::arg("indices"), py::arg("num_indices"), py::arg("num_rows"),
          py::arg("row_bytes"), py::arg("num_threads"));
}

}  // namespace bertfast
