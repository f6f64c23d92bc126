// What the CPU (csrc/cpu_ops.cpp, csrc/cpu_int8_ops.cpp) and CUDA
// (csrc/cuda/cuda_ops.cpp) bindings share: argument checks that raise an error naming
// the op and the argument, and the per-op validation, written once for both backends
// (one argument order for both; the CUDA entry points add a trailing `stream`).
//
// The tensor entry points are torch operators registered through the LibTorch stable
// ABI (torch/csrc/stable, STABLE_TORCH_LIBRARY, in each backend's file), built for
// TORCH_TARGET_VERSION (CMakeLists.txt): the extension calls torch only through its
// stable C shim, so one build loads with that torch and every later one. An error is
// thrown as std::invalid_argument / std::out_of_range / std::runtime_error whose
// message starts with "ValueError: ", "IndexError: " or "TypeError: ";
// bertfast/_operators.py raises it as that Python exception, the tag removed.
// Kernels never include this header (they take raw pointers and sizes that the
// checks here have validated against the tensors' real extents).
#pragma once

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "constants.h"

namespace bertfast {
namespace binding {

using Tensor = torch::stable::Tensor;
using OptTensor = std::optional<Tensor>;
using ScalarType = torch::headeronly::ScalarType;
using DeviceType = torch::headeronly::DeviceType;
using Shape = std::vector<int64_t>;
using Sizes = torch::headeronly::IntHeaderOnlyArrayRef;

[[noreturn]] inline void throw_value_error(const std::string& msg) {
  throw std::invalid_argument("ValueError: " + msg);
}
[[noreturn]] inline void throw_type_error(const std::string& msg) {
  throw std::runtime_error("TypeError: " + msg);
}
[[noreturn]] inline void throw_index_error(const std::string& msg) {
  throw std::out_of_range("IndexError: " + msg);
}

inline std::string dtype_name(ScalarType t) { return torch::headeronly::toString(t); }

inline const char* device_type_name(DeviceType t) {
  switch (t) {
    case DeviceType::CPU:
      return "cpu";
    case DeviceType::CUDA:
      return "cuda";
    case DeviceType::Meta:
      return "meta";
    default:
      return "another device type";
  }
}

inline std::string device_name(const torch::stable::Device& d) {
  std::string s = device_type_name(d.type());
  if (d.has_index()) s += ":" + std::to_string(static_cast<int>(d.index()));
  return s;
}

// An uninitialised contiguous tensor of `shape` with `like`'s device and `dtype`
// (default: like's). Through the C shim's aoti_torch_empty_strided, not
// torch::stable::empty: that one is a boxed dispatcher call by name ("aten::empty"),
// whose argument boxing alone made about 9 heap allocations a tensor; a MiniLM int8
// 1x16 forward makes some 80 tensors in its one native call (measured 1.03-1.07x the
// whole forward, benchmarks/results/cpu-intel-xeon-amx-2t/notes.md).
inline Tensor empty(const Shape& shape, const Tensor& like,
                    std::optional<ScalarType> dtype = std::nullopt) {
  const ScalarType type = dtype ? *dtype : like.scalar_type();
  const torch::stable::Device device = like.device();
  if (device.type() != DeviceType::CPU && device.type() != DeviceType::CUDA)
    return torch::stable::empty(Sizes(shape), type, std::nullopt, device);
  Shape strides(shape.size(), 1);  // contiguous
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  const int32_t shim_dtype = torch::stable::detail::to<int32_t>(torch::stable::detail::from(type));
  const int32_t shim_device = device.type() == DeviceType::CPU ? aoti_torch_device_type_cpu()
                                                               : aoti_torch_device_type_cuda();
  AtenTensorHandle handle = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(
      static_cast<int64_t>(shape.size()), shape.data(), strides.data(), shim_dtype, shim_device,
      device.has_index() ? device.index() : -1, &handle));
  return Tensor(handle);
}

inline Shape shape_of(const Tensor& t) {
  const Sizes s = t.sizes();
  return Shape(s.begin(), s.end());
}

inline bool same_sizes(const Tensor& a, const Tensor& b) { return a.sizes().equals(b.sizes()); }

// Whether two contiguous tensors share part of their bytes without being the same
// bytes (the same tensor, or a view of all of it, is a full overlap).
inline bool partial_overlap(const Tensor& a, const Tensor& b) {
  const auto* pa = static_cast<const char*>(a.const_data_ptr());
  const auto* pb = static_cast<const char*>(b.const_data_ptr());
  const auto na = static_cast<size_t>(a.numel()) * a.element_size();
  const auto nb = static_cast<size_t>(b.numel()) * b.element_size();
  if (na == 0 || nb == 0) return false;
  if (pa == pb && na == nb) return false;
  return pa < pb + nb && pb < pa + na;
}

// torch's intra-op thread count (torch.get_num_threads()): the CPU kernels' threads.
inline int threads() { return std::max(1, static_cast<int>(torch::stable::get_num_threads())); }

// The micro-kernel a CPU entry point was asked for (its `isa` argument, else the
// environment variable `env`, read at every call; empty: auto), lowercased, and where it
// came from ("isa" or the variable's name) for the error messages.
struct IsaRequest {
  std::string name;
  std::string source;
};
inline IsaRequest isa_request(const std::optional<std::string>& isa, const char* env) {
  IsaRequest r{isa ? *isa : std::string(), isa ? "isa" : env};
  if (!isa) {
    const char* value = std::getenv(env);
    if (value) r.name = value;
  }
  for (char& c : r.name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

// One native entry point's checks: every failure raises ValueError / TypeError /
// IndexError "bertfast._C.<backend>.<op>: <what was wrong>". Every tensor must be
// strided, contiguous and on the same device (the first one checked fixes it).
class Op {
 public:
  Op(const char* backend, const char* name, DeviceType device_type)
      : backend_(backend), name_(name), device_type_(device_type) {}

  [[noreturn]] void value_error(const std::string& msg) const { throw_value_error(prefix() + msg); }
  [[noreturn]] void type_error(const std::string& msg) const { throw_type_error(prefix() + msg); }
  [[noreturn]] void index_error(const std::string& msg) const { throw_index_error(prefix() + msg); }

  // Strided, contiguous, on this op's device.
  void tensor(const Tensor& t, const char* name) {
    if (!t.defined()) type_error(std::string(name) + " is an undefined tensor");
    if (t.layout() != torch::headeronly::Layout::Strided)
      type_error(std::string(name) + " must be a strided (dense) tensor");
    const torch::stable::Device dev = t.device();
    if (dev.type() != device_type_)
      value_error(std::string(name) + " is on " + device_name(dev) + "; this entry point takes " +
                  device_type_name(device_type_) + " tensors");
    if (!device_) {
      device_ = dev;
    } else if (*device_ != dev) {
      value_error(std::string(name) + " is on " + device_name(dev) + ", the other tensors on " +
                  device_name(*device_));
    }
    if (!t.is_contiguous()) value_error(std::string(name) + " must be contiguous");
  }

  // tensor() with a floating-point storage dtype the kernels take; returns its DType.
  int float_tensor(const Tensor& t, const char* name) {
    tensor(t, name);
    switch (t.scalar_type()) {
      case ScalarType::Float:
        return kFloat32;
      case ScalarType::Half:
        return kFloat16;
      case ScalarType::BFloat16:
        return kBFloat16;
      default:
        type_error(std::string(name) + " has dtype " + dtype_name(t.scalar_type()) +
                   "; expected float32, float16 or bfloat16");
    }
  }

  // tensor() of exactly this dtype.
  void tensor(const Tensor& t, const char* name, ScalarType dtype) {
    tensor(t, name);
    if (t.scalar_type() != dtype)
      type_error(std::string(name) + " has dtype " + dtype_name(t.scalar_type()) + ", expected " +
                 dtype_name(dtype));
  }

  // tensor() with ref's dtype.
  void like(const Tensor& t, const char* name, const Tensor& ref, const char* ref_name) {
    tensor(t, name);
    if (t.scalar_type() != ref.scalar_type())
      type_error(std::string(name) + " has dtype " + dtype_name(t.scalar_type()) + " but " +
                 ref_name + " has " + dtype_name(ref.scalar_type()));
  }

  void dims(const Tensor& t, const char* name, int64_t n) const {
    if (t.dim() != n)
      value_error(std::string(name) + " must have " + std::to_string(n) +
                  " dimension(s), got shape " + shape(t));
  }

  void min_dims(const Tensor& t, const char* name, int64_t n) const {
    if (t.dim() < n)
      value_error(std::string(name) + " must have at least " + std::to_string(n) +
                  " dimension(s), got shape " + shape(t));
  }

  void size(const Tensor& t, const char* name, int64_t dim, int64_t expected,
            const char* what) const {
    const int64_t got = t.size(dim);
    if (got != expected)
      value_error(std::string(name) + " has size " + std::to_string(got) + " in dim " +
                  std::to_string(dim < 0 ? dim + t.dim() : dim) + ", expected " +
                  std::to_string(expected) + " (" + what + ")");
  }

  // 1-D [n] with ref's dtype.
  void vector(const Tensor& t, const char* name, int64_t n, const Tensor& ref,
              const char* ref_name) {
    like(t, name, ref, ref_name);
    dims(t, name, 1);
    size(t, name, 0, n, "the row width");
  }

  // Integer ids the kernels index with: int64, `shape`.
  void ids(const Tensor& t, const char* name, Sizes expected_shape, const char* shape_of) {
    tensor(t, name, ScalarType::Long);
    if (!t.sizes().equals(expected_shape))
      value_error(std::string(name) + " has shape " + shape(t) + ", expected " +
                  shape(expected_shape) + " (the shape of " + shape_of + ")");
  }

  // The activation code of `name` (None -> kNoActivation when allowed).
  int activation(const std::optional<std::string>& name, bool allow_none) const {
    if (!name) {
      if (allow_none) return kNoActivation;
      value_error("activation must be one of gelu, gelu_tanh, relu, got None");
    }
    for (int code = 0; code < static_cast<int>(std::size(kActivationNames)); ++code)
      if (*name == kActivationNames[code]) return code;
    value_error("unknown activation '" + *name + "'; expected gelu, gelu_tanh or relu" +
                (allow_none ? " (or None)" : ""));
  }

  void positive(double v, const char* name) const {
    if (!(v > 0)) value_error(std::string(name) + " must be positive, got " + std::to_string(v));
  }

  const char* name() const { return name_; }

  static std::string shape(Sizes sizes) {
    std::string s = "(";
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (i) s += ", ";
      s += std::to_string(sizes[i]);
    }
    return s + (sizes.size() == 1 ? ",)" : ")");
  }
  static std::string shape(const Tensor& t) { return shape(t.sizes()); }

 private:
  std::string prefix() const { return std::string("bertfast._C.") + backend_ + "." + name_ + ": "; }

  const char* backend_;
  const char* name_;
  DeviceType device_type_;
  std::optional<torch::stable::Device> device_;
};

// ---------------------------------------------------------------- per-op checks
// Each validates every tensor the kernel reads or writes and returns the sizes it
// derived; the binding allocates the output from them.

struct EmbedArgs {
  int dtype;
  int64_t tokens, width, vocab, num_pos, num_types;  // num_types 0 without token types
};

inline EmbedArgs check_embed_layernorm(Op& op, const Tensor& input_ids, const Tensor& position_ids,
                                       const OptTensor& token_type_ids, const Tensor& word,
                                       const Tensor& pos, const OptTensor& types,
                                       const Tensor& weight, const Tensor& bias, double eps) {
  EmbedArgs a{};
  a.dtype = op.float_tensor(word, "word_embeddings");
  op.dims(word, "word_embeddings", 2);
  a.vocab = word.size(0);
  a.width = word.size(1);
  op.like(pos, "position_embeddings", word, "word_embeddings");
  op.dims(pos, "position_embeddings", 2);
  op.size(pos, "position_embeddings", 1, a.width, "word_embeddings width");
  a.num_pos = pos.size(0);
  if (types.has_value() != token_type_ids.has_value())
    op.value_error("token_type_ids and token_type_embeddings must be given together");
  if (types) {
    op.like(*types, "token_type_embeddings", word, "word_embeddings");
    op.dims(*types, "token_type_embeddings", 2);
    op.size(*types, "token_type_embeddings", 1, a.width, "word_embeddings width");
    a.num_types = types->size(0);
  }
  op.vector(weight, "weight", a.width, word, "word_embeddings");
  op.vector(bias, "bias", a.width, word, "word_embeddings");
  op.tensor(input_ids, "input_ids", ScalarType::Long);
  op.ids(position_ids, "position_ids", input_ids.sizes(), "input_ids");
  if (token_type_ids) op.ids(*token_type_ids, "token_type_ids", input_ids.sizes(), "input_ids");
  op.positive(eps, "eps");
  a.tokens = input_ids.numel();
  return a;
}

inline Shape embed_out_shape(const Tensor& input_ids, int64_t width) {
  Shape shape = shape_of(input_ids);
  shape.push_back(width);
  return shape;
}

struct RowsArgs {
  int dtype;
  int64_t rows, width;
};

inline RowsArgs check_add_layernorm(Op& op, const Tensor& x, const Tensor& residual,
                                    const OptTensor& bias, const Tensor& weight,
                                    const Tensor& ln_bias, double eps) {
  RowsArgs a{};
  a.dtype = op.float_tensor(x, "x");
  op.min_dims(x, "x", 1);
  a.width = x.size(-1);
  a.rows = a.width ? x.numel() / a.width : 0;
  op.like(residual, "residual", x, "x");
  if (!same_sizes(residual, x))
    op.value_error("residual has shape " + Op::shape(residual) + ", x has " + Op::shape(x));
  if (bias) op.vector(*bias, "bias", a.width, x, "x");
  op.vector(weight, "weight", a.width, x, "x");
  op.vector(ln_bias, "ln_bias", a.width, x, "x");
  op.positive(eps, "eps");
  return a;
}

struct BiasActArgs {
  int dtype, activation;
  int64_t rows, width;
};

inline BiasActArgs check_bias_act(Op& op, const Tensor& x, const OptTensor& bias,
                                  const std::string& activation) {
  BiasActArgs a{};
  a.dtype = op.float_tensor(x, "x");
  op.min_dims(x, "x", 1);
  a.width = x.size(-1);
  a.rows = a.width ? x.numel() / a.width : 0;
  if (bias) op.vector(*bias, "bias", a.width, x, "x");
  a.activation = op.activation(activation, /*allow_none=*/false);
  return a;
}

struct AttentionArgs {
  int dtype;
  int64_t batch, seqlen, tokens, hidden, num_heads, head_dim;
};

inline void check_heads(Op& op, const Tensor& qkv, int64_t num_heads, AttentionArgs& a) {
  const int64_t h3 = qkv.size(-1);
  if (h3 % 3) op.value_error("qkv last dimension " + std::to_string(h3) + " is not 3 * hidden");
  a.hidden = h3 / 3;
  if (num_heads <= 0 || a.hidden % num_heads)
    op.value_error("hidden size " + std::to_string(a.hidden) +
                   " is not divisible by num_heads=" + std::to_string(num_heads));
  a.num_heads = num_heads;
  a.head_dim = a.hidden / num_heads;
}

inline AttentionArgs check_attention(Op& op, const Tensor& qkv, const OptTensor& mask,
                                     int64_t num_heads) {
  AttentionArgs a{};
  a.dtype = op.float_tensor(qkv, "qkv");
  op.dims(qkv, "qkv", 3);
  check_heads(op, qkv, num_heads, a);
  a.batch = qkv.size(0);
  a.seqlen = qkv.size(1);
  a.tokens = a.batch * a.seqlen;
  if (mask) {
    op.tensor(*mask, "attention_mask");
    if (mask->scalar_type() != ScalarType::Bool && mask->scalar_type() != ScalarType::Byte)
      op.type_error("attention_mask has dtype " + dtype_name(mask->scalar_type()) +
                    ", expected bool or uint8 (nonzero = real token)");
    if (mask->dim() != 2 || mask->size(0) != a.batch || mask->size(1) != a.seqlen)
      op.value_error("attention_mask has shape " + Op::shape(*mask) + ", expected [batch, seq] (" +
                     std::to_string(a.batch) + ", " + std::to_string(a.seqlen) + ")");
  }
  return a;
}

// Sizes only: the values of cu_seqlens are checked by the CPU kernel (it raises)
// and clamped by the CUDA kernel (no host sync).
inline AttentionArgs check_attention_varlen(Op& op, const Tensor& qkv, const Tensor& cu_seqlens,
                                            int64_t max_seqlen, int64_t num_heads) {
  AttentionArgs a{};
  a.dtype = op.float_tensor(qkv, "qkv");
  op.dims(qkv, "qkv", 2);
  check_heads(op, qkv, num_heads, a);
  op.tensor(cu_seqlens, "cu_seqlens", ScalarType::Int);
  op.dims(cu_seqlens, "cu_seqlens", 1);
  if (cu_seqlens.size(0) < 1) op.value_error("cu_seqlens must have batch + 1 >= 1 entries");
  if (max_seqlen < 0) op.value_error("max_seqlen must be >= 0, got " + std::to_string(max_seqlen));
  a.batch = cu_seqlens.size(0) - 1;
  a.seqlen = max_seqlen;
  a.tokens = qkv.size(0);
  return a;
}

struct RowMoveArgs {
  int64_t num_indices, row_bytes;
};

inline int64_t row_bytes_of(const Tensor& x) {
  int64_t n = static_cast<int64_t>(x.element_size());
  for (int64_t d = 1; d < x.dim(); ++d) n *= x.size(d);
  return n;
}

inline RowMoveArgs check_pack_rows(Op& op, const Tensor& x, const Tensor& indices) {
  op.tensor(x, "x");
  op.min_dims(x, "x", 1);
  op.tensor(indices, "indices", ScalarType::Long);
  op.dims(indices, "indices", 1);
  return {indices.size(0), row_bytes_of(x)};
}

inline RowMoveArgs check_unpack_rows(Op& op, const Tensor& x, const Tensor& indices,
                                     int64_t num_rows) {
  RowMoveArgs a = check_pack_rows(op, x, indices);
  op.size(indices, "indices", 0, x.size(0), "one index per row of x");
  if (num_rows < 0) op.value_error("num_rows must be >= 0, got " + std::to_string(num_rows));
  return a;
}

inline Shape rows_shape(const Tensor& x, int64_t rows) {
  Shape shape = shape_of(x);
  shape[0] = rows;
  return shape;
}

}  // namespace binding
}  // namespace bertfast
