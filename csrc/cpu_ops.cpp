// bertfast._C.cpu: the CPU kernels in kernels/cpu/ as torch operators
// (torch.ops.bertfast_cpu.*, registered through the stable ABI: csrc/binding.h;
// its module init puts each on bertfast._C.cpu: bertfast/_operators.py).
//
// Every entry point takes torch tensors, checks them (csrc/binding.h: device,
// dtype, contiguity, every size the kernel relies on; a mismatch raises
// ValueError / TypeError / IndexError naming the op and the argument), allocates
// its output and runs the kernel on torch's intra-op thread count
// (torch.get_num_threads()); torch releases the GIL around an operator call. The
// argument order is the CUDA side's (csrc/cuda/cuda_ops.cpp), which adds a trailing
// `stream`.
#include <torch/csrc/stable/library.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "binding.h"
#include "cpu_bf16_ops.h"
#include "cpu_int8_ops.h"
#include "registry.h"

#include "cpu/kernels.h"

namespace bertfast {
namespace {

using namespace binding;

constexpr const char* kBackend = "cpu";

Op cpu_op(const char* name) { return Op(kBackend, name, DeviceType::CPU); }

Tensor embed_layernorm(const Tensor& input_ids, const Tensor& position_ids,
                       const OptTensor& token_type_ids, const Tensor& word, const Tensor& pos,
                       const OptTensor& types, const Tensor& weight, const Tensor& bias,
                       double eps) {
  Op op = cpu_op("embed_layernorm");
  const EmbedArgs a = check_embed_layernorm(op, input_ids, position_ids, token_type_ids, word, pos,
                                            types, weight, bias, eps);
  Tensor out = empty(embed_out_shape(input_ids, a.width), word);
  if (a.tokens == 0 || a.width == 0) return out;
  // Ids outside their table give a NaN row (the kernel never reads out of bounds).
  cpu::embed_layernorm(a.dtype, out.data_ptr(), input_ids.const_data_ptr<int64_t>(),
                       position_ids.const_data_ptr<int64_t>(),
                       types ? token_type_ids->const_data_ptr<int64_t>() : nullptr,
                       word.const_data_ptr(), a.vocab, pos.const_data_ptr(), a.num_pos,
                       types ? types->const_data_ptr() : nullptr, a.num_types,
                       weight.const_data_ptr(), bias.const_data_ptr(), a.tokens, a.width,
                       static_cast<float>(eps), threads());
  return out;
}

Tensor add_layernorm(const Tensor& x, const Tensor& residual, const OptTensor& bias,
                     const Tensor& weight, const Tensor& ln_bias, double eps,
                     const OptTensor& out_opt) {
  Op op = cpu_op("add_layernorm");
  const RowsArgs a = check_add_layernorm(op, x, residual, bias, weight, ln_bias, eps);
  Tensor out;
  if (out_opt) {
    // Rows are read whole before their output row is written: `out` may be x or
    // residual itself, never another part of them.
    out = *out_opt;
    op.like(out, "out", x, "x");
    if (!same_sizes(out, x))
      op.value_error("out has shape " + Op::shape(out) + ", x has " + Op::shape(x));
    for (const Tensor* t : {&x, &residual})
      if (partial_overlap(out, *t))
        op.value_error("out overlaps x or residual partly; pass them or a separate tensor");
  } else {
    out = empty(shape_of(x), x);
  }
  if (a.rows == 0 || a.width == 0) return out;
  cpu::add_layernorm(a.dtype, out.data_ptr(), x.const_data_ptr(), residual.const_data_ptr(),
                     bias ? bias->const_data_ptr() : nullptr, weight.const_data_ptr(),
                     ln_bias.const_data_ptr(), a.rows, a.width, static_cast<float>(eps), threads());
  return out;
}

Tensor bias_act(const Tensor& x, const OptTensor& bias, const std::string& activation,
                bool inplace) {
  Op op = cpu_op("bias_act");
  const BiasActArgs a = check_bias_act(op, x, bias, activation);
  Tensor out = inplace ? x : empty(shape_of(x), x);
  if (a.rows == 0 || a.width == 0) return out;
  cpu::bias_act(a.dtype, out.data_ptr(), x.const_data_ptr(),
                bias ? bias->const_data_ptr() : nullptr, a.rows, a.width, a.activation, threads());
  return out;
}

Tensor attention(const Tensor& qkv, const OptTensor& mask, int64_t num_heads, double scale) {
  Op op = cpu_op("attention");
  const AttentionArgs a = check_attention(op, qkv, mask, num_heads);
  Tensor out = empty({a.batch, a.seqlen, a.hidden}, qkv);
  if (out.numel() == 0) return out;
  cpu::attention_padded(a.dtype, out.data_ptr(), qkv.const_data_ptr(),
                        mask ? static_cast<const uint8_t*>(mask->const_data_ptr()) : nullptr,
                        a.batch, a.seqlen, a.num_heads, a.hidden, static_cast<float>(scale),
                        threads());
  return out;
}

Tensor attention_varlen(const Tensor& qkv, const Tensor& cu_seqlens, int64_t max_seqlen,
                        int64_t num_heads, double scale) {
  Op op = cpu_op("attention_varlen");
  const AttentionArgs a = check_attention_varlen(op, qkv, cu_seqlens, max_seqlen, num_heads);
  // cu_seqlens must rise from 0 to the token count (IndexError otherwise) and no
  // sequence may be longer than max_seqlen (the CUDA kernel sizes its grid by it).
  const int32_t* cu = cu_seqlens.const_data_ptr<int32_t>();
  if (cu[0] != 0 || cu[a.batch] != a.tokens)
    op.index_error("cu_seqlens must rise from 0 to the token count " + std::to_string(a.tokens) +
                   ", got " + std::to_string(cu[0]) + " .. " + std::to_string(cu[a.batch]));
  for (int64_t b = 0; b < a.batch; ++b) {
    if (cu[b + 1] < cu[b])
      op.index_error("cu_seqlens falls at entry " + std::to_string(b + 1) + " (" +
                     std::to_string(cu[b]) + " -> " + std::to_string(cu[b + 1]) + ")");
    if (int64_t(cu[b + 1]) - cu[b] > max_seqlen)
      op.value_error("sequence " + std::to_string(b) +
                     " is longer than max_seqlen=" + std::to_string(max_seqlen));
  }
  Tensor out = empty({a.tokens, a.hidden}, qkv);
  if (a.hidden == 0) return out;
  cpu::attention_varlen(a.dtype, out.data_ptr(), qkv.const_data_ptr(), cu, a.batch, a.tokens,
                        a.num_heads, a.hidden, static_cast<float>(scale), threads());
  return out;
}

Tensor pack_rows(const Tensor& x, const Tensor& indices) {
  Op op = cpu_op("pack_rows");
  const RowMoveArgs a = check_pack_rows(op, x, indices);
  Tensor out = empty(rows_shape(x, a.num_indices), x);
  // Raises IndexError for an index outside [0, x.shape[0]) before copying anything.
  cpu::pack_rows(out.data_ptr(), x.const_data_ptr(), indices.const_data_ptr<int64_t>(),
                 a.num_indices, x.size(0), a.row_bytes, threads());
  return out;
}

Tensor unpack_rows(const Tensor& x, const Tensor& indices, int64_t num_rows) {
  Op op = cpu_op("unpack_rows");
  const RowMoveArgs a = check_unpack_rows(op, x, indices, num_rows);
  Tensor out = empty(rows_shape(x, num_rows), x);
  cpu::unpack_rows(out.data_ptr(), x.const_data_ptr(), indices.const_data_ptr<int64_t>(),
                   a.num_indices, num_rows, a.row_bytes, threads());
  return out;
}

// A forward's inputs read once (kernels/cpu/pack.cpp scan_inputs): the model's value
// checks and where its real tokens are, in one call instead of a torch op per value.
// -> (stats int64 [8]: ids min, max, token types min, max, positions min, max, real
// tokens, longest row; cu_seqlens int32 [B + 1]; indices int64 [real tokens]).
std::tuple<Tensor, Tensor, Tensor> scan_inputs(const Tensor& input_ids,
                                               const OptTensor& attention_mask,
                                               const OptTensor& token_type_ids,
                                               const OptTensor& position_ids) {
  Op op = cpu_op("scan_inputs");
  op.tensor(input_ids, "input_ids", ScalarType::Long);
  op.dims(input_ids, "input_ids", 2);
  const int64_t B = input_ids.size(0), S = input_ids.size(1);
  if (B * S > std::numeric_limits<int32_t>::max())
    op.value_error("input_ids holds " + std::to_string(B * S) +
                   " positions; cu_seqlens (int32) counts at most 2^31 - 1");
  int kind = cpu::kScanMaskNone;
  const void* mask = nullptr;
  if (attention_mask) {
    op.tensor(*attention_mask, "attention_mask");
    if (!attention_mask->sizes().equals(input_ids.sizes()))
      op.value_error("attention_mask has shape " + Op::shape(attention_mask->sizes()) +
                     ", expected " + Op::shape(input_ids.sizes()) + " (the shape of input_ids)");
    switch (attention_mask->scalar_type()) {
      case ScalarType::Long:
        kind = cpu::kScanMaskInt64;
        break;
      case ScalarType::Int:
        kind = cpu::kScanMaskInt32;
        break;
      case ScalarType::Bool:
        kind = cpu::kScanMaskBool;
        break;
      default:
        op.type_error("attention_mask has dtype " + dtype_name(attention_mask->scalar_type()) +
                      "; expected int64, int32 or bool");
    }
    mask = attention_mask->const_data_ptr();
  }
  if (token_type_ids) op.ids(*token_type_ids, "token_type_ids", input_ids.sizes(), "input_ids");
  if (position_ids) op.ids(*position_ids, "position_ids", input_ids.sizes(), "input_ids");
  Tensor stats = empty({cpu::kScanStats}, input_ids);
  Tensor cu = empty({B + 1}, input_ids, ScalarType::Int);
  int64_t* st = stats.mutable_data_ptr<int64_t>();
  cpu::scan_inputs(st, cu.mutable_data_ptr<int32_t>(), input_ids.const_data_ptr<int64_t>(), mask,
                   kind, token_type_ids ? token_type_ids->const_data_ptr<int64_t>() : nullptr,
                   position_ids ? position_ids->const_data_ptr<int64_t>() : nullptr, B, S);
  Tensor indices = empty({st[6]}, input_ids);
  cpu::scan_indices(indices.mutable_data_ptr<int64_t>(), st[6], mask, kind, B * S);
  return {stats, cu, indices};
}

// One vector per sequence of packed fp32 rows (kernels/cpu/pool.cpp): the Embedder's
// pooling of a forward's output while it is in cache, optionally L2-normalised.
constexpr const char* kPoolNames[] = {"cls", "mean", "mean_sqrt_len", "lasttoken"};

Tensor pool_packed(const Tensor& h, const Tensor& cu_seqlens, const std::string& mode,
                   bool normalize) {
  Op op = cpu_op("pool_packed");
  op.tensor(h, "h", ScalarType::Float);
  op.dims(h, "h", 2);
  op.tensor(cu_seqlens, "cu_seqlens", ScalarType::Int);
  op.dims(cu_seqlens, "cu_seqlens", 1);
  int code = -1;
  for (int c = 0; c < static_cast<int>(std::size(kPoolNames)); ++c)
    if (mode == kPoolNames[c]) code = c;
  if (code < 0)
    op.value_error("unknown pooling mode '" + mode +
                   "'; expected cls, mean, mean_sqrt_len or lasttoken");
  const int64_t T = h.size(0), H = h.size(1), B = cu_seqlens.size(0) - 1;
  if (B < 1) op.value_error("cu_seqlens must hold at least 2 entries (one sequence)");
  // Every sequence must have a row: rising strictly from 0 to the row count.
  const int32_t* cu = cu_seqlens.const_data_ptr<int32_t>();
  if (cu[0] != 0 || cu[B] != T)
    op.index_error("cu_seqlens must rise from 0 to the row count " + std::to_string(T) + ", got " +
                   std::to_string(cu[0]) + " .. " + std::to_string(cu[B]));
  for (int64_t b = 0; b < B; ++b)
    if (cu[b + 1] <= cu[b])
      op.value_error("sequence " + std::to_string(b) + " has no row (cu_seqlens " +
                     std::to_string(cu[b]) + " -> " + std::to_string(cu[b + 1]) + ")");
  Tensor out = empty({B, H}, h);
  if (H == 0) return out;
  cpu::pool_packed(static_cast<float*>(out.data_ptr()), h.const_data_ptr<float>(), cu, B, H, code,
                   normalize);
  return out;
}

// ---------------------------------------------------------------- GEMM (fp32, CPU only)
struct LinearArgs {
  int activation;
  int64_t M, N, K;
};

LinearArgs check_linear(Op& op, const Tensor& x, int64_t N, const OptTensor& bias,
                        const std::optional<std::string>& activation) {
  LinearArgs a{};
  op.tensor(x, "x", ScalarType::Float);
  op.min_dims(x, "x", 1);
  a.K = x.size(-1);
  a.M = 1;  // the leading dims (also when K == 0: then out = act(bias))
  for (int64_t d = 0; d + 1 < x.dim(); ++d) a.M *= x.size(d);
  a.N = N;
  if (bias) {
    op.tensor(*bias, "bias", ScalarType::Float);
    op.dims(*bias, "bias", 1);
    op.size(*bias, "bias", 0, N, "out_features");
  }
  a.activation = op.activation(activation, /*allow_none=*/true);
  return a;
}

Shape linear_out_shape(const Tensor& x, int64_t N) {
  Shape shape = shape_of(x);
  shape.back() = N;
  return shape;
}

Tensor linear_act(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                  const std::optional<std::string>& activation, bool allow_avx512) {
  Op op = cpu_op("linear_act");
  op.tensor(weight, "weight", ScalarType::Float);
  op.dims(weight, "weight", 2);
  const LinearArgs a = check_linear(op, x, weight.size(0), bias, activation);
  op.size(weight, "weight", 1, a.K, "x's last dimension");
  Tensor out = empty(linear_out_shape(x, a.N), x);
  if (out.numel() == 0) return out;
  cpu::linear_act(out.data_ptr(), x.const_data_ptr(), weight.const_data_ptr(),
                  bias ? bias->const_data_ptr() : nullptr, a.M, a.N, a.K, a.activation,
                  allow_avx512, threads());
  return out;
}

// packed: [ceil(N / panel) , K, panel] floats, panel = linear_panel_width(allow_avx512).
Tensor linear_pack(const Tensor& weight, bool allow_avx512) {
  Op op = cpu_op("linear_pack");
  op.tensor(weight, "weight", ScalarType::Float);
  op.dims(weight, "weight", 2);
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t panel = cpu::linear_panel_width(allow_avx512);
  Tensor packed = empty({(N + panel - 1) / panel, K, panel}, weight);
  if (packed.numel() == 0) return packed;
  cpu::linear_pack(packed.data_ptr(), weight.const_data_ptr(), N, K, allow_avx512, threads());
  return packed;
}

Tensor linear_packed(const Tensor& x, const Tensor& packed, const OptTensor& bias,
                     int64_t out_features, const std::optional<std::string>& activation,
                     bool allow_avx512) {
  Op op = cpu_op("linear_packed");
  if (out_features < 0)
    op.value_error("out_features must be >= 0, got " + std::to_string(out_features));
  const LinearArgs a = check_linear(op, x, out_features, bias, activation);
  op.tensor(packed, "packed", ScalarType::Float);
  op.dims(packed, "packed", 3);
  // Panels of the GEMM's own width, or of a multiple of it (oneDNN's 64-wide blocks).
  const int64_t nr = cpu::linear_panel_width(allow_avx512);
  const int64_t panel = packed.size(2);
  if (panel <= 0 || panel % nr != 0)
    op.value_error("packed: panel width (dim 2) must be a multiple of " + std::to_string(nr) +
                   " for this allow_avx512, got " + std::to_string(panel));
  op.size(packed, "packed", 1, a.K, "x's last dimension");
  op.size(packed, "packed", 0, (a.N + panel - 1) / panel, "panels for out_features");
  Tensor out = empty(linear_out_shape(x, a.N), x);
  if (out.numel() == 0) return out;
  cpu::linear_packed(out.data_ptr(), x.const_data_ptr(), packed.const_data_ptr(),
                     bias ? bias->const_data_ptr() : nullptr, a.M, a.N, a.K, panel, a.activation,
                     allow_avx512, threads());
  return out;
}

// Whether a step ran inside the one running now on this thread (the step profile
// records innermost steps only: a layer's GEMMs, not the layer).
thread_local bool t_inner_step = false;

// run() timed into the step profile (registry.h) when no step ran inside it.
template <typename F>
Tensor timed_step(const char* name, F&& run) {
  t_inner_step = false;
  const auto t0 = std::chrono::steady_clock::now();
  Tensor out = run();
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
  if (!t_inner_step) step_profile_record(name, took.count());
  t_inner_step = true;  // for the step this one ran inside
  return out;
}

// run(), its error raised as the caller's: an error of the entry point it calls
// ("<Kind>: bertfast._C.cpu.<inner>: <what>") becomes op's, naming the part:
// "<Kind>: bertfast._C.cpu.<op>: <name> (<inner>): <what>".
template <typename F>
Tensor errors_as(const Op& op, const char* name, F&& run) {
  const auto renamed = [name](const std::string& msg) {
    const std::string prefix = "bertfast._C.cpu.";
    if (msg.rfind(prefix, 0) == 0) {
      const size_t colon = msg.find(": ", prefix.size());
      if (colon != std::string::npos)
        return std::string(name) + " (" + msg.substr(prefix.size(), colon - prefix.size()) +
               "): " + msg.substr(colon + 2);
    }
    return std::string(name) + ": " + msg;
  };
  // The message without its "<Kind>: " tag when it has that tag.
  const auto untagged = [](const char* what, const char* tag) -> std::optional<std::string> {
    const std::string msg(what);
    if (msg.rfind(tag, 0) != 0) return std::nullopt;
    return msg.substr(std::string(tag).size());
  };
  try {
    return run();
  } catch (const std::exception& e) {
    if (auto m = untagged(e.what(), "ValueError: ")) op.value_error(renamed(*m));
    if (auto m = untagged(e.what(), "TypeError: ")) op.type_error(renamed(*m));
    if (auto m = untagged(e.what(), "IndexError: ")) op.index_error(renamed(*m));
    throw;
  }
}

// One step of a composite entry point (encoder_layer, encoder_forward): its errors
// named as errors_as names them, its time in the step profile when that is on.
template <typename F>
Tensor step(const Op& op, const char* name, F&& run) {
  return errors_as(op, name, [&] { return step_profile_on() ? timed_step(name, run) : run(); });
}

// attention_varlen on the bf16 rounding of an fp32 qkv, its bf16 output widened back
// to fp32: what an int8 model's attention runs (bertfast/ops/cpu/int8.py,
// attention_dtype), in the one call and op by op alike. The two conversions are
// cpu::convert's (nearest even), with no torch cast or its per-call cost between.
Tensor attention_varlen_bf16(const Tensor& qkv, const Tensor& cu_seqlens, int64_t max_seqlen,
                             int64_t num_heads, double scale) {
  Op op = cpu_op("attention_varlen_bf16");
  op.tensor(qkv, "qkv", ScalarType::Float);
  Tensor q16 = empty(shape_of(qkv), qkv, ScalarType::BFloat16);
  cpu::convert(kFloat32, kBFloat16, q16.data_ptr(), qkv.const_data_ptr(), qkv.numel(), threads());
  // Not a step: the conversions and this call are one step of a composite together.
  const Tensor ctx = errors_as(op, "attention", [&] {
    return attention_varlen(q16, cu_seqlens, max_seqlen, num_heads, scale);
  });
  Tensor out = empty(shape_of(ctx), ctx, ScalarType::Float);
  cpu::convert(kBFloat16, kFloat32, out.data_ptr(), ctx.const_data_ptr(), ctx.numel(), threads());
  return out;
}

// A composite's linear step on packed panels: fp32 h on linear_packed's panels, bf16 h
// on blinear's (bgemm_pack's; kernels/cpu/bgemm.h). Any other dtype is named by
// linear_packed's check.
Tensor packed_linear(const Tensor& h, const Tensor& packed, const OptTensor& bias, int64_t N,
                     const std::optional<std::string>& activation, bool allow_avx512) {
  if (h.scalar_type() == ScalarType::BFloat16) return cpu_blinear(h, packed, bias, N, activation);
  return linear_packed(h, packed, bias, N, activation, allow_avx512);
}

// One encoder layer in one call, for rows every GEMM runs on the C++ GEMM (the model's
// few-rows path: no Python between the ops). The ops and their order are the model's
// layer (bertfast/model.py, _layers_direct), each through its entry point above, so
// every size is checked as there and the result is the same bit for bit:
//   h1 = LayerNorm(proj(attention(qkv(h))) + proj_bias + h)
//   h2 = LayerNorm(ffn_out(act(ffn_in(h1))) + ffn_out_bias + h1)
// The weights are packed for linear_packed (allow_avx512 as the model packed them);
// for a bf16 h (a bf16 model), for blinear (allow_avx512 unused), every step in bf16.
Tensor encoder_layer(const Tensor& h, const Tensor& cu_seqlens, int64_t max_seqlen,
                     int64_t num_heads, double scale, const Tensor& qkv, const OptTensor& qkv_bias,
                     const Tensor& attn_out, const OptTensor& attn_out_bias,
                     const Tensor& attn_ln_weight, const Tensor& attn_ln_bias, const Tensor& ffn_in,
                     const OptTensor& ffn_in_bias, int64_t intermediate,
                     const std::optional<std::string>& activation, const Tensor& ffn_out,
                     const OptTensor& ffn_out_bias, const Tensor& ffn_ln_weight,
                     const Tensor& ffn_ln_bias, double eps, bool allow_avx512) {
  Op op = cpu_op("encoder_layer");
  if (h.scalar_type() != ScalarType::BFloat16) op.tensor(h, "h", ScalarType::Float);
  op.dims(h, "h", 2);
  if (intermediate < 0)
    op.value_error("intermediate must be >= 0, got " + std::to_string(intermediate));
  const int64_t H = h.size(1);
  const Tensor y = step(op, "QKV projection", [&] {
    return packed_linear(h, qkv, qkv_bias, 3 * H, std::nullopt, allow_avx512);
  });
  const Tensor ctx = step(op, "attention", [&] {
    return attention_varlen(y, cu_seqlens, max_seqlen, num_heads, scale);
  });
  Tensor a = step(op, "attention output projection", [&] {
    return packed_linear(ctx, attn_out, std::nullopt, H, std::nullopt, allow_avx512);
  });
  // LayerNorm rows are read whole before written: each writes over its GEMM's output.
  const Tensor h1 = step(op, "attention LayerNorm", [&] {
    return add_layernorm(a, h, attn_out_bias, attn_ln_weight, attn_ln_bias, eps, OptTensor(a));
  });
  const Tensor f = step(op, "FFN in", [&] {
    return packed_linear(h1, ffn_in, ffn_in_bias, intermediate, activation, allow_avx512);
  });
  Tensor o = step(op, "FFN out", [&] {
    return packed_linear(f, ffn_out, std::nullopt, H, std::nullopt, allow_avx512);
  });
  return step(op, "FFN LayerNorm", [&] {
    return add_layernorm(o, h1, ffn_out_bias, ffn_ln_weight, ffn_ln_bias, eps, OptTensor(o));
  });
}

// encoder_layer for a model loaded with quantize="int8" (its attention in fp32, or
// attention_varlen_bf16 when attention_bf16, as quant.attention_dtype says): each
// linear layer is qlinear on the layer's int8 weight (packed, colsum, w_scale as
// qgemm_pack and the model made them; bit g of `split` is GEMM g's split flag, the
// GEMMs in the order QKV, attention output, FFN in, FFN out). The ops and their order
// are the op-by-op int8 layer's (bertfast/ops/cpu/encoder.py; biases where it passes
// them), so the result is the same bit for bit.
Tensor encoder_layer_int8(
    const Tensor& h, const Tensor& cu_seqlens, int64_t max_seqlen, int64_t num_heads, double scale,
    const Tensor& qkv, const Tensor& qkv_colsum, const Tensor& qkv_scale, const OptTensor& qkv_bias,
    const Tensor& attn_out, const Tensor& attn_out_colsum, const Tensor& attn_out_scale,
    const OptTensor& attn_out_bias, const Tensor& attn_ln_weight, const Tensor& attn_ln_bias,
    const Tensor& ffn_in, const Tensor& ffn_in_colsum, const Tensor& ffn_in_scale,
    const OptTensor& ffn_in_bias, const std::optional<std::string>& activation,
    const Tensor& ffn_out, const Tensor& ffn_out_colsum, const Tensor& ffn_out_scale,
    const OptTensor& ffn_out_bias, const Tensor& ffn_ln_weight, const Tensor& ffn_ln_bias,
    double eps, int64_t split, bool attention_bf16) {
  Op op = cpu_op("encoder_layer_int8");
  op.tensor(h, "h", ScalarType::Float);
  op.dims(h, "h", 2);
  if (split < 0 || split > 15)
    op.value_error("split must be a 4-bit mask (0 .. 15), got " + std::to_string(split));
  const auto split_of = [split](int g) { return ((split >> g) & 1) != 0; };
  const std::optional<std::string> none;
  const Tensor y = step(op, "QKV projection", [&] {
    return cpu_qlinear(h, qkv, qkv_colsum, qkv_scale, qkv_bias, none, none, split_of(0));
  });
  const Tensor ctx = step(op, "attention", [&] {
    if (!attention_bf16) return attention_varlen(y, cu_seqlens, max_seqlen, num_heads, scale);
    return attention_varlen_bf16(y, cu_seqlens, max_seqlen, num_heads, scale);
  });
  Tensor a = step(op, "attention output projection", [&] {
    return cpu_qlinear(ctx, attn_out, attn_out_colsum, attn_out_scale, std::nullopt, none, none,
                       split_of(1));
  });
  const Tensor h1 = step(op, "attention LayerNorm", [&] {
    return add_layernorm(a, h, attn_out_bias, attn_ln_weight, attn_ln_bias, eps, OptTensor(a));
  });
  const Tensor f = step(op, "FFN in", [&] {
    return cpu_qlinear(h1, ffn_in, ffn_in_colsum, ffn_in_scale, ffn_in_bias, activation, none,
                       split_of(2));
  });
  Tensor o = step(op, "FFN out", [&] {
    return cpu_qlinear(f, ffn_out, ffn_out_colsum, ffn_out_scale, std::nullopt, none, none,
                       split_of(3));
  });
  return step(op, "FFN LayerNorm", [&] {
    return add_layernorm(o, h1, ffn_out_bias, ffn_ln_weight, ffn_ln_bias, eps, OptTensor(o));
  });
}

// ------------------------------------------------------------- the encoder in one call
// The steps of encoder_forward / encoder_forward_int8 before the layers: the embedding
// sum + LayerNorm of the packed tokens, then (ALBERT, ELECTRA) the projection to the
// hidden size on the C++ GEMM (`project`: its panels; None: no projection).
Tensor embed_project(Op& op, const Tensor& input_ids, const Tensor& position_ids,
                     const OptTensor& token_type_ids, const Tensor& word, const Tensor& pos,
                     const OptTensor& types, const Tensor& emb_ln_weight, const Tensor& emb_ln_bias,
                     const OptTensor& project, const OptTensor& project_bias, int64_t hidden,
                     double eps, bool allow_avx512) {
  if (hidden < 0) op.value_error("hidden must be >= 0, got " + std::to_string(hidden));
  op.dims(input_ids, "input_ids", 1);  // packed tokens: [T]
  const Tensor e = step(op, "embeddings", [&] {
    return embed_layernorm(input_ids, position_ids, token_type_ids, word, pos, types, emb_ln_weight,
                           emb_ln_bias, eps);
  });
  if (!project) {
    if (project_bias) op.value_error("project_bias given without project");
    if (e.size(1) != hidden)
      op.value_error("the embeddings are " + std::to_string(e.size(1)) + " wide, hidden is " +
                     std::to_string(hidden) + " (and no project given)");
    return e;
  }
  return step(op, "embedding projection", [&] {
    return packed_linear(e, *project, project_bias, hidden, std::nullopt, allow_avx512);
  });
}

// The layer count of encoder_forward(_int8)'s lists: `gemms` holds `per_gemm` tensors
// a layer, `biases` and `norms` 4 each, for the same number of layers.
int64_t forward_layers(const Op& op, const std::vector<Tensor>& gemms, size_t per_gemm,
                       const std::vector<OptTensor>& biases, const std::vector<Tensor>& norms) {
  if (gemms.size() % per_gemm != 0)
    op.value_error("gemms must hold " + std::to_string(per_gemm) + " tensors a layer, got " +
                   std::to_string(gemms.size()));
  const size_t layers = gemms.size() / per_gemm;
  const std::pair<const char*, size_t> others[] = {{"biases", biases.size()},
                                                   {"norms", norms.size()}};
  for (const auto& [name, size] : others)
    if (size != 4 * layers)
      op.value_error(std::string(name) + " must hold 4 tensors a layer (" +
                     std::to_string(4 * layers) + " for the " + std::to_string(layers) +
                     " layers of gemms), got " + std::to_string(size));
  return static_cast<int64_t>(layers);
}

std::string layer_name(int64_t i) { return "layer " + std::to_string(i); }

// The embeddings and every encoder layer of a model in one call (the cpu backend's
// encoder runner for rows every GEMM runs on the C++ GEMM: bertfast/ops/cpu/encoder.py):
// embed_project, then encoder_layer per layer in the order given (ALBERT's shared layer
// given once per use). `gemms`: 4 panels a layer (QKV, attention output, FFN in, FFN
// out), `biases`: their biases, `norms`: 4 a layer (attention LayerNorm weight, bias,
// FFN LayerNorm weight, bias). Each step is the entry point above with its checks, in
// the runner's op-by-op order, so the result equals it bit for bit; an error names the
// layer and the step.
Tensor encoder_forward(const Tensor& input_ids, const Tensor& position_ids,
                       const OptTensor& token_type_ids, const Tensor& word, const Tensor& pos,
                       const OptTensor& types, const Tensor& emb_ln_weight,
                       const Tensor& emb_ln_bias, const OptTensor& project,
                       const OptTensor& project_bias, int64_t hidden, const Tensor& cu_seqlens,
                       int64_t max_seqlen, int64_t num_heads, double scale,
                       const std::vector<Tensor>& gemms, const std::vector<OptTensor>& biases,
                       const std::vector<Tensor>& norms, int64_t intermediate,
                       const std::optional<std::string>& activation, double eps,
                       bool allow_avx512) {
  Op op = cpu_op("encoder_forward");
  const int64_t layers = forward_layers(op, gemms, 4, biases, norms);
  Tensor h =
      embed_project(op, input_ids, position_ids, token_type_ids, word, pos, types, emb_ln_weight,
                    emb_ln_bias, project, project_bias, hidden, eps, allow_avx512);
  for (int64_t i = 0; i < layers; ++i) {
    const size_t g = 4 * i;
    const std::string name = layer_name(i);
    h = step(op, name.c_str(), [&] {
      return encoder_layer(h, cu_seqlens, max_seqlen, num_heads, scale, gemms[g], biases[g],
                           gemms[g + 1], biases[g + 1], norms[g], norms[g + 1], gemms[g + 2],
                           biases[g + 2], intermediate, activation, gemms[g + 3], biases[g + 3],
                           norms[g + 2], norms[g + 3], eps, allow_avx512);
    });
  }
  return h;
}

// encoder_forward for a model loaded with quantize="int8": encoder_layer_int8 per
// layer. `gemms`: 12 tensors a layer (packed, colsum, w_scale of QKV, attention
// output, FFN in, FFN out), `splits`: each layer's 4-bit split mask; the embedding
// projection stays fp32 (its panels); attention_bf16 as encoder_layer_int8's.
Tensor encoder_forward_int8(const Tensor& input_ids, const Tensor& position_ids,
                            const OptTensor& token_type_ids, const Tensor& word, const Tensor& pos,
                            const OptTensor& types, const Tensor& emb_ln_weight,
                            const Tensor& emb_ln_bias, const OptTensor& project,
                            const OptTensor& project_bias, int64_t hidden, const Tensor& cu_seqlens,
                            int64_t max_seqlen, int64_t num_heads, double scale,
                            const std::vector<Tensor>& gemms, const std::vector<OptTensor>& biases,
                            const std::vector<Tensor>& norms, const std::vector<int64_t>& splits,
                            const std::optional<std::string>& activation, double eps,
                            bool attention_bf16) {
  Op op = cpu_op("encoder_forward_int8");
  const int64_t layers = forward_layers(op, gemms, 12, biases, norms);
  if (static_cast<int64_t>(splits.size()) != layers)
    op.value_error("splits must hold one mask a layer (" + std::to_string(layers) + "), got " +
                   std::to_string(splits.size()));
  Tensor h = embed_project(op, input_ids, position_ids, token_type_ids, word, pos, types,
                           emb_ln_weight, emb_ln_bias, project, project_bias, hidden, eps,
                           /*allow_avx512=*/true);
  for (int64_t i = 0; i < layers; ++i) {
    const size_t g = 12 * i, b = 4 * i;
    const std::string name = layer_name(i);
    h = step(op, name.c_str(), [&] {
      return encoder_layer_int8(h, cu_seqlens, max_seqlen, num_heads, scale, gemms[g], gemms[g + 1],
                                gemms[g + 2], biases[b], gemms[g + 3], gemms[g + 4], gemms[g + 5],
                                biases[b + 1], norms[b], norms[b + 1], gemms[g + 6], gemms[g + 7],
                                gemms[g + 8], biases[b + 2], activation, gemms[g + 9],
                                gemms[g + 10], gemms[g + 11], biases[b + 3], norms[b + 2],
                                norms[b + 3], eps, splits[i], attention_bf16);
    });
  }
  return h;
}

// ------------------------------------------------- a model's operands held by handle
// encoder_forward's embedding and layer operands kept here between calls: encoder_hold
// takes them once and returns a handle, encoder_forward_held(handle, ...) runs
// encoder_forward / encoder_forward_int8 on them, encoder_release lets them go. A
// call that passes its ~80 (fp32) to ~125 (int8) tensors in lists pays their boxing
// every time (about 0.4 us a tensor: a MiniLM int8 1x16 forward's 50 us). The
// operands are held as given, and every call runs the entry point on them, so the
// same checks and the same result. The table lives for the process (leaked on
// purpose: handles may be released after static destructors ran).
struct HeldOperands {
  Tensor word, pos;
  OptTensor types;
  Tensor ln_weight, ln_bias;
  OptTensor project, project_bias;
  std::vector<Tensor> gemms;
  std::vector<OptTensor> biases;
  std::vector<Tensor> norms;
  std::optional<std::vector<int64_t>> splits;  // int8
};

class HeldTable {
 public:
  int64_t add(std::shared_ptr<const HeldOperands> ops) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t handle = next_++;
    held_.emplace(handle, std::move(ops));
    return handle;
  }
  std::shared_ptr<const HeldOperands> get(int64_t handle) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = held_.find(handle);
    return it == held_.end() ? nullptr : it->second;
  }
  bool drop(int64_t handle) {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.erase(handle) > 0;
  }

 private:
  std::mutex mu_;
  std::unordered_map<int64_t, std::shared_ptr<const HeldOperands>> held_;
  int64_t next_ = 1;
};

HeldTable& held_table() {
  static HeldTable* table = new HeldTable();
  return *table;
}

int64_t encoder_hold(const Tensor& word, const Tensor& pos, const OptTensor& types,
                     const Tensor& emb_ln_weight, const Tensor& emb_ln_bias,
                     const OptTensor& project, const OptTensor& project_bias,
                     const std::vector<Tensor>& gemms, const std::vector<OptTensor>& biases,
                     const std::vector<Tensor>& norms,
                     const std::optional<std::vector<int64_t>>& splits) {
  Op op = cpu_op("encoder_hold");
  // the list counts now (every tensor is checked by the entry point at each call)
  const int64_t layers = forward_layers(op, gemms, splits ? 12 : 4, biases, norms);
  if (splits && static_cast<int64_t>(splits->size()) != layers)
    op.value_error("splits must hold one mask a layer (" + std::to_string(layers) + "), got " +
                   std::to_string(splits->size()));
  auto ops = std::make_shared<HeldOperands>(HeldOperands{word, pos, types, emb_ln_weight,
                                                         emb_ln_bias, project, project_bias, gemms,
                                                         biases, norms, splits});
  return held_table().add(std::move(ops));
}

bool encoder_release(int64_t handle) { return held_table().drop(handle); }

Tensor encoder_forward_held(const Tensor& input_ids, const Tensor& position_ids,
                            const OptTensor& token_type_ids, int64_t handle, int64_t hidden,
                            const Tensor& cu_seqlens, int64_t max_seqlen, int64_t num_heads,
                            double scale, int64_t intermediate,
                            const std::optional<std::string>& activation, double eps,
                            bool attention_bf16, bool allow_avx512) {
  Op op = cpu_op("encoder_forward_held");
  // a reference for the whole call: a release meanwhile frees nothing under it
  const std::shared_ptr<const HeldOperands> h = held_table().get(handle);
  if (!h)
    op.value_error("no operands are held under handle " + std::to_string(handle) +
                   " (never made by encoder_hold, or released)");
  if (h->splits)
    return encoder_forward_int8(input_ids, position_ids, token_type_ids, h->word, h->pos, h->types,
                                h->ln_weight, h->ln_bias, h->project, h->project_bias, hidden,
                                cu_seqlens, max_seqlen, num_heads, scale, h->gemms, h->biases,
                                h->norms, *h->splits, activation, eps, attention_bf16);
  if (attention_bf16)
    op.value_error("attention in bfloat16 is for int8 operands only (these are not int8)");
  return encoder_forward(input_ids, position_ids, token_type_ids, h->word, h->pos, h->types,
                         h->ln_weight, h->ln_bias, h->project, h->project_bias, hidden, cu_seqlens,
                         max_seqlen, num_heads, scale, h->gemms, h->biases, h->norms, intermediate,
                         activation, eps, allow_avx512);
}

}  // namespace
}  // namespace bertfast

// Schemas: the argument names and defaults are the Python keywords.
STABLE_TORCH_LIBRARY(bertfast_cpu, m) {
  // LayerNorm(word[ids] + types[tt] + pos[p]) -> [*ids.shape, E]; a NaN row for an id
  // outside its table.
  m.def(
      "embed_layernorm(Tensor input_ids, Tensor position_ids, Tensor? token_type_ids, "
      "Tensor word, Tensor pos, Tensor? types, Tensor weight, Tensor bias, float eps) -> Tensor");
  // LayerNorm((x + bias) + residual) over the last dim, into out (optional: x, residual
  // or a tensor of x's shape not overlapping them).
  m.def(
      "add_layernorm(Tensor x, Tensor residual, Tensor? bias, Tensor weight, Tensor ln_bias, "
      "float eps, Tensor(a!)? out=None) -> Tensor");
  // act(x + bias) over the last dim (gelu, gelu_tanh, relu); inplace writes into x.
  m.def("bias_act(Tensor(a!) x, Tensor? bias, str activation, bool inplace) -> Tensor");
  // Attention over qkv [B, S, 3H], key mask [B, S] (bool/uint8, optional) -> [B, S, H].
  m.def("attention(Tensor qkv, Tensor? mask, int num_heads, float scale) -> Tensor");
  // Attention over packed qkv [T, 3H] with cu_seqlens [B + 1] (int32) -> [T, H].
  m.def(
      "attention_varlen(Tensor qkv, Tensor cu_seqlens, int max_seqlen, int num_heads, "
      "float scale) -> Tensor");
  // attention_varlen on fp32 qkv rounded to bf16 (nearest even), the output widened
  // back to fp32 [T, H] (an int8 model's attention; quant.attention_dtype).
  m.def(
      "attention_varlen_bf16(Tensor qkv, Tensor cu_seqlens, int max_seqlen, int num_heads, "
      "float scale) -> Tensor");
  // x[indices] (IndexError out of range).
  m.def("pack_rows(Tensor x, Tensor indices) -> Tensor");
  // out[indices[i]] = x[i], zero rows elsewhere, num_rows rows.
  m.def("unpack_rows(Tensor x, Tensor indices, int num_rows) -> Tensor");
  // One fp32 vector per sequence of packed rows h [T, H] (cu_seqlens [B + 1], each
  // sequence at least one row): cls, mean, mean_sqrt_len or lasttoken, then
  // L2-normalised when asked -> [B, H].
  m.def("pool_packed(Tensor h, Tensor cu_seqlens, str mode, bool normalize=False) -> Tensor");
  // A forward's inputs [B, S] read once: (stats int64 [8]: ids min, max, token types
  // min, max, positions min, max, real tokens, longest row; cu_seqlens int32 [B + 1];
  // indices int64 [real tokens]); mask int64 / int32 / bool, nonzero = real.
  m.def(
      "scan_inputs(Tensor input_ids, Tensor? attention_mask, Tensor? token_type_ids, "
      "Tensor? position_ids) -> (Tensor, Tensor, Tensor)");
  // fp32 act(x @ weight.T + bias), activation None/gelu/gelu_tanh/relu; allow_avx512=False
  // forces the AVX2 kernel.
  m.def(
      "linear_act(Tensor x, Tensor weight, Tensor? bias, str? activation, "
      "bool allow_avx512=True) -> Tensor");
  // weight [N, K] packed for linear_packed: [ceil(N / panel), K, panel].
  m.def("linear_pack(Tensor weight, bool allow_avx512=True) -> Tensor");
  // linear_act with a weight packed by linear_pack (same allow_avx512).
  m.def(
      "linear_packed(Tensor x, Tensor packed, Tensor? bias, int out_features, str? activation, "
      "bool allow_avx512=True) -> Tensor");
  // One encoder layer on packed tokens h [T, H]: QKV, attention_varlen, output
  // projection + add_layernorm, FFN in + activation, FFN out + add_layernorm; fp32 h on
  // weights packed by linear_pack (or oneDNN's 64-wide panels), bf16 h on bgemm_pack's
  // (or oneDNN's bf16 panels, the same layout); packed_linear picks by h's dtype.
  m.def(
      "encoder_layer(Tensor h, Tensor cu_seqlens, int max_seqlen, int num_heads, float scale, "
      "Tensor qkv, Tensor? qkv_bias, Tensor attn_out, Tensor? attn_out_bias, "
      "Tensor attn_ln_weight, Tensor attn_ln_bias, Tensor ffn_in, Tensor? ffn_in_bias, "
      "int intermediate, str? activation, Tensor ffn_out, Tensor? ffn_out_bias, "
      "Tensor ffn_ln_weight, Tensor ffn_ln_bias, float eps, bool allow_avx512=True) -> Tensor");
  // encoder_layer with int8 linear layers (qlinear's packed, colsum, w_scale each;
  // split: a 4-bit mask of the GEMMs' split flags), attention in fp32 or, when
  // attention_bf16, attention_varlen_bf16.
  m.def(
      "encoder_layer_int8(Tensor h, Tensor cu_seqlens, int max_seqlen, int num_heads, "
      "float scale, Tensor qkv, Tensor qkv_colsum, Tensor qkv_scale, Tensor? qkv_bias, "
      "Tensor attn_out, Tensor attn_out_colsum, Tensor attn_out_scale, Tensor? attn_out_bias, "
      "Tensor attn_ln_weight, Tensor attn_ln_bias, Tensor ffn_in, Tensor ffn_in_colsum, "
      "Tensor ffn_in_scale, Tensor? ffn_in_bias, str? activation, Tensor ffn_out, "
      "Tensor ffn_out_colsum, Tensor ffn_out_scale, Tensor? ffn_out_bias, "
      "Tensor ffn_ln_weight, Tensor ffn_ln_bias, float eps, int split, "
      "bool attention_bf16=False) -> Tensor");
  // The embeddings (embed_layernorm, then the projection's panels when given) and
  // every encoder layer (encoder_layer; gemms, biases, norms: 4 a layer) in one call.
  m.def(
      "encoder_forward(Tensor input_ids, Tensor position_ids, Tensor? token_type_ids, "
      "Tensor word, Tensor pos, Tensor? types, Tensor emb_ln_weight, Tensor emb_ln_bias, "
      "Tensor? project, Tensor? project_bias, int hidden, Tensor cu_seqlens, int max_seqlen, "
      "int num_heads, float scale, Tensor[] gemms, Tensor?[] biases, Tensor[] norms, "
      "int intermediate, str? activation, float eps, bool allow_avx512=True) -> Tensor");
  // encoder_forward with encoder_layer_int8 layers (gemms: 12 a layer, splits: 1).
  m.def(
      "encoder_forward_int8(Tensor input_ids, Tensor position_ids, Tensor? token_type_ids, "
      "Tensor word, Tensor pos, Tensor? types, Tensor emb_ln_weight, Tensor emb_ln_bias, "
      "Tensor? project, Tensor? project_bias, int hidden, Tensor cu_seqlens, int max_seqlen, "
      "int num_heads, float scale, Tensor[] gemms, Tensor?[] biases, Tensor[] norms, "
      "int[] splits, str? activation, float eps, bool attention_bf16=False) -> Tensor");
  // encoder_forward's (or, with splits, encoder_forward_int8's) weights held between
  // calls under the returned handle; encoder_forward_held runs the one on them;
  // encoder_release drops them (False: nothing was held under the handle).
  m.def(
      "encoder_hold(Tensor word, Tensor pos, Tensor? types, Tensor emb_ln_weight, "
      "Tensor emb_ln_bias, Tensor? project, Tensor? project_bias, Tensor[] gemms, "
      "Tensor?[] biases, Tensor[] norms, int[]? splits) -> int");
  m.def(
      "encoder_forward_held(Tensor input_ids, Tensor position_ids, Tensor? token_type_ids, "
      "int handle, int hidden, Tensor cu_seqlens, int max_seqlen, int num_heads, float scale, "
      "int intermediate, str? activation, float eps, bool attention_bf16=False, "
      "bool allow_avx512=True) -> Tensor");
  m.def("encoder_release(int handle) -> bool");
}

// CompositeExplicitAutograd: every device reaches the entry point, whose own check
// names the wrong device.
STABLE_TORCH_LIBRARY_IMPL(bertfast_cpu, CompositeExplicitAutograd, m) {
  using namespace bertfast;
  m.impl("embed_layernorm", TORCH_BOX(&embed_layernorm));
  m.impl("add_layernorm", TORCH_BOX(&add_layernorm));
  m.impl("bias_act", TORCH_BOX(&bias_act));
  m.impl("attention", TORCH_BOX(&attention));
  m.impl("attention_varlen", TORCH_BOX(&attention_varlen));
  m.impl("attention_varlen_bf16", TORCH_BOX(&attention_varlen_bf16));
  m.impl("pack_rows", TORCH_BOX(&pack_rows));
  m.impl("unpack_rows", TORCH_BOX(&unpack_rows));
  m.impl("pool_packed", TORCH_BOX(&pool_packed));
  m.impl("scan_inputs", TORCH_BOX(&scan_inputs));
  m.impl("linear_act", TORCH_BOX(&linear_act));
  m.impl("linear_pack", TORCH_BOX(&linear_pack));
  m.impl("linear_packed", TORCH_BOX(&linear_packed));
  m.impl("encoder_layer", TORCH_BOX(&encoder_layer));
  m.impl("encoder_layer_int8", TORCH_BOX(&encoder_layer_int8));
  m.impl("encoder_forward", TORCH_BOX(&encoder_forward));
  m.impl("encoder_forward_int8", TORCH_BOX(&encoder_forward_int8));
  m.impl("encoder_hold", TORCH_BOX(&encoder_hold));
  m.impl("encoder_forward_held", TORCH_BOX(&encoder_forward_held));
  m.impl("encoder_release", TORCH_BOX(&encoder_release));
}
