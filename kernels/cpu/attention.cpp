// Multi-head self-attention reading the fused QKV tensor, heads merged on output.
//
//   qkv [tokens, 3H]  = [Q | K | V], head h at columns h*d, H + h*d, 2H + h*d
//   out [tokens, H]   = softmax(scale * Q K^T over the sequence's real keys) V
//
// Two entry points share one kernel: attention_padded ([B, S] with a key-padding
// mask; padded query rows are written as zeros, a sequence with no real key gives
// zeros) and attention_varlen (packed sequences delimited by cu_seqlens).
//
// Work split: one task = (sequence, head, block of BLOCK_M query rows); OpenMP
// dynamic schedule over tasks, longest sequences first. Each task runs on the
// micro-kernels chosen for the call (attention_isa below):
//   attention_fp32.cpp  fp32 math for every storage dtype: AVX-512 or AVX2/FMA
//                       register-blocked micro-kernels, queries in vector lanes;
//   attention_bf16.cpp  bf16 storage on a CPU with AVX512-BF16: bf16 products on AMX
//                       tiles (tdpbf16ps) or vdpbf16ps, fp32 sums and softmax.
// What they share (block sizes, scratch, the rows of a task, the softmax step):
// attention_internal.h.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu/attention_internal.h"
#include "cpu/common.h"
#include "cpu/kernels.h"

namespace bertfast {
namespace cpu {
namespace attn {
namespace {

struct Task {
  int64_t seq, head, q0;
};

// The micro-kernels a call runs on, best first. BERTFAST_CPU_ATTENTION_ISA forces a
// lesser one (tests cover every path on one machine): "avx512bf16" = vdpbf16ps
// without AMX tiles, "avx512" = AVX-512 without bf16 dot products (bf16 storage then
// runs the fp32-math kernel), "avx2" = the AVX2 baseline. Read per call, so a test
// can set it in-process. The bf16 paths serve bf16 storage only.
enum class Isa { kAvx2, kAvx512, kAvx512Bf16, kAmxBf16 };

Isa attention_isa() {
#if defined(BF_X86)
  const char* env = std::getenv("BERTFAST_CPU_ATTENTION_ISA");
  const auto is = [env](const char* name) { return env && std::strcmp(env, name) == 0; };
  const Isa cap = is("avx2")         ? Isa::kAvx2
                  : is("avx512")     ? Isa::kAvx512
                  : is("avx512bf16") ? Isa::kAvx512Bf16
                                     : Isa::kAmxBf16;
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
  if (!avx512 || cap == Isa::kAvx2) return Isa::kAvx2;
  if (cap == Isa::kAvx512 || !__builtin_cpu_supports("avx512bf16")) return Isa::kAvx512;
  if (cap == Isa::kAvx512Bf16 || !amx_available()) return Isa::kAvx512Bf16;
  return Isa::kAmxBf16;
#else
  return Isa::kAvx2;
#endif
}

// One task on the chosen micro-kernels.
template <typename T>
BF_INLINE void run_task(Isa isa, T* out, const T* qkv, const Sequence& sq, int64_t h, int64_t q0,
                        int64_t num_heads, int64_t hidden, float scale, Scratch& sc) {
#if defined(BF_X86)
  if constexpr (std::is_same_v<T, bf16>) {
    if (isa == Isa::kAmxBf16 || isa == Isa::kAvx512Bf16) {
      run_bf16_task(isa == Isa::kAmxBf16, out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
      return;
    }
  }
#endif
  run_fp32_task<T>(isa != Isa::kAvx2, out, qkv, sq, h, q0, num_heads, hidden, scale, sc);
}

template <typename T>
void attention_impl(T* out, const T* qkv, const std::vector<Sequence>& seqs, int64_t num_heads,
                    int64_t hidden, float scale, int num_threads) {
  const int64_t d = hidden / num_heads;
  std::vector<Task> tasks;
  int64_t work = 0;
  for (int64_t s = 0; s < static_cast<int64_t>(seqs.size()); ++s) {
    for (int64_t h = 0; h < num_heads; ++h)
      for (int64_t q0 = 0; q0 < seqs[s].len; q0 += BLOCK_M) tasks.push_back({s, h, q0});
    work += seqs[s].len * seqs[s].len * num_heads * d;
  }
  // Longest sequences first: with the dynamic schedule the short tasks left at the
  // end even out the threads of a ragged batch.
  std::stable_sort(tasks.begin(), tasks.end(), [&seqs](const Task& a, const Task& b) {
    return seqs[a.seq].len > seqs[b.seq].len;
  });
  const int64_t ntasks = static_cast<int64_t>(tasks.size());
  if (ntasks == 0) return;
  int nt = threads_for(work, 1 << 16, num_threads);
  nt = static_cast<int>(std::min<int64_t>(nt, ntasks));
  const Isa isa = attention_isa();

#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel num_threads(nt)
#endif
  {
    // The thread's scratch is kept from call to call (its vectors keep their capacity):
    // made afresh per call, its vectors grew from empty in every task, about 40 heap
    // allocations a layer at 16 tokens.
    static thread_local Scratch sc;
    // AMX tiles are configured once per thread and call, not per task
    [[maybe_unused]] const bool tiles = std::is_same_v<T, bf16> && isa == Isa::kAmxBf16;
#if defined(BF_X86)
    if (tiles) amx_tiles_begin();
#endif
#ifdef BERTFAST_WITH_OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
    for (int64_t t = 0; t < ntasks; ++t) {
      const Sequence& sq = seqs[tasks[t].seq];
      run_task<T>(isa, out, qkv, sq, tasks[t].head, tasks[t].q0, num_heads, hidden, scale, sc);
    }
#if defined(BF_X86)
    if (tiles) amx_tiles_end();
#endif
  }
}

}  // namespace
}  // namespace attn

void attention_padded(int dtype, void* out, const void* qkv, const uint8_t* mask, int64_t batch,
                      int64_t seqlen, int64_t num_heads, int64_t hidden, float scale,
                      int num_threads) {
  if (batch <= 0 || seqlen <= 0 || hidden <= 0) return;
  if (num_heads <= 0 || hidden % num_heads)
    throw std::invalid_argument("bertfast cpu attention: hidden not divisible by num_heads");
  std::vector<attn::Sequence> seqs(batch);
  for (int64_t b = 0; b < batch; ++b)
    seqs[b] = {b * seqlen, seqlen, mask ? mask + b * seqlen : nullptr};
  BF_DISPATCH_DTYPE(dtype, T,
                    attn::attention_impl<T>(static_cast<T*>(out), static_cast<const T*>(qkv), seqs,
                                            num_heads, hidden, scale, num_threads));
}

void attention_varlen(int dtype, void* out, const void* qkv, const int32_t* cu_seqlens,
                      int64_t batch, int64_t tokens, int64_t num_heads, int64_t hidden, float scale,
                      int num_threads) {
  if (num_heads <= 0 || hidden <= 0 || hidden % num_heads)
    throw std::invalid_argument("bertfast cpu attention_varlen: hidden not divisible by num_heads");
  // Bounds-safe whatever the caller checked: cu_seqlens must rise from 0 to tokens.
  if (batch < 0 || cu_seqlens[0] != 0 || cu_seqlens[batch] != tokens)
    throw std::out_of_range(
        "bertfast cpu attention_varlen: cu_seqlens must rise from 0 to the token count");
  std::vector<attn::Sequence> seqs;
  seqs.reserve(batch);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t a = cu_seqlens[b], e = cu_seqlens[b + 1];
    if (e < a || e > tokens)
      throw std::out_of_range("bertfast cpu attention_varlen: cu_seqlens is not non-decreasing");
    if (e > a) seqs.push_back({a, e - a, nullptr});
  }
  if (tokens <= 0) return;
  BF_DISPATCH_DTYPE(dtype, T,
                    attn::attention_impl<T>(static_cast<T*>(out), static_cast<const T*>(qkv), seqs,
                                            num_heads, hidden, scale, num_threads));
}

}  // namespace cpu
}  // namespace bertfast
