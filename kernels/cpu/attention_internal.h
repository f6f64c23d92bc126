// Internal to the CPU attention (kernels/cpu/attention.cpp, attention_fp32.cpp,
// attention_bf16.cpp); nothing else includes it. What the driver (attention.cpp:
// tasks, instruction-set choice, entry points) and the two families of micro-kernels
// share: the block sizes, a sequence and the per-thread scratch, the rows a task
// works on, the scalar online-softmax step, and the per-task entry points of each
// family (defined in its own file, called by the driver).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/common.h"

#if defined(__GNUC__) && defined(__x86_64__)
#define BF_X86 1
#endif

namespace bertfast {
namespace cpu {
namespace attn {

constexpr int64_t BLOCK_M = 256;  // query rows per task (K / V are packed once per task)
constexpr int64_t BLOCK_N = 128;  // keys per online-softmax step

struct Sequence {
  int64_t token0;       // first token (row of qkv / out)
  int64_t len;          // tokens (queries == keys)
  const uint8_t* mask;  // [len] nonzero = real token, or null (all real)
};

// Per-thread scratch, reused across tasks.
struct Scratch {
  std::vector<int64_t> keys, qrows;
  std::vector<float> kt, vbuf, qbuf, obuf, sbuf;
  // bf16 path: 32-bit words, each a pair of bf16 along the reduction dimension
  std::vector<uint32_t> kt2, v2, q2;
  std::vector<uint16_t> p16;  // P rows in bf16, read as pairs
  std::vector<float> pvbuf;   // AMX: one key block's P V
};

// The keys and query rows a task works on: the sequence's real keys, and its real
// query rows in [q0, q0 + BLOCK_M) (the others are written as zeros here: padded
// query rows, or every row when no key is real). Returns false when no row is left.
template <typename T>
bool select_rows(const Sequence& sq, int64_t q0, T* obase, int64_t hidden, int64_t d, Scratch& sc) {
  const int64_t q1 = std::min(q0 + BLOCK_M, sq.len);
  const T zero = from_f32<T>(0.0f);
  sc.keys.clear();
  for (int64_t j = 0; j < sq.len; ++j)
    if (!sq.mask || sq.mask[j]) sc.keys.push_back(j);
  const bool any_key = !sc.keys.empty();
  sc.qrows.clear();
  for (int64_t i = q0; i < q1; ++i) {
    if (any_key && (!sq.mask || sq.mask[i])) {
      sc.qrows.push_back(i);
    } else {
      T* o = obase + i * hidden;
      for (int64_t dd = 0; dd < d; ++dd) o[dd] = zero;
    }
  }
  return !sc.qrows.empty();
}

// One row of an online-softmax step, shared by all paths. sr holds BLOCK_N fp32
// scores (those past the block's real keys already -inf); they are replaced by
// p = exp(s - m_new). Updates the running max m (and with kSum the running sum l:
// the bf16 paths sum P after rounding it) and returns alpha = exp(m_old - m_new).
//
// Non-finite scores propagate as in torch's softmax, with nothing added to the
// loops: fast_exp(NaN) is NaN, so a NaN score (NaN in q, k or scale) makes its p,
// the row sum and the row NaN whatever the max reduction did with it; a +inf
// score gives p = exp(inf - inf) = NaN. While every score so far is -inf, the
// offset is 0 instead of -inf (exp(-inf - -inf) would be NaN): those keys get
// p = 0, and a row whose real scores are all -inf ends with l = 0 and is written
// as p V = 0 (torch's SDPA: zeros; NaN still where V holds inf or NaN, as 0 * inf
// in torch).
template <bool kSum>
BF_INLINE float softmax_step(float* BF_RESTRICT sr, float& m, float& l) {
  float mx = -std::numeric_limits<float>::infinity();
  BF_SIMD_REDUCE_MAX(mx)
  for (int64_t j = 0; j < BLOCK_N; ++j) mx = fmax_(mx, sr[j]);
  const float m_new = fmax_(m, mx);
  const float m_off = m_new == -std::numeric_limits<float>::infinity() ? 0.0f : m_new;
  const float alpha = fast_exp(m - m_off);  // exp(-inf) == 0 on the first block
  if constexpr (kSum) {
    float sum = 0.0f;
    BF_SIMD_REDUCE_ADD(sum)
    for (int64_t j = 0; j < BLOCK_N; ++j) {
      const float p = fast_exp(sr[j] - m_off);
      sr[j] = p;
      sum += p;
    }
    l = l * alpha + sum;
  } else {
    for (int64_t j = 0; j < BLOCK_N; ++j) sr[j] = fast_exp(sr[j] - m_off);
  }
  m = m_new;
  return alpha;
}

// ------------------------------------------------------------------ per-task entry points
// One task: query rows [q0, q0 + BLOCK_M) of head h of sequence sq, its output rows
// written (zeros for padded query rows). The OpenMP loop stays in the driver, outside
// them (an outlined parallel region would not inherit a target attribute).

// attention_fp32.cpp: fp32 math for every storage dtype, AVX-512 micro-kernels when
// avx512 (the caller checked the CPU has them), else AVX2/FMA. Instantiated there for
// float, f16 and bf16.
template <typename T>
void run_fp32_task(bool avx512, T* out, const T* qkv, const Sequence& sq, int64_t h, int64_t q0,
                   int64_t num_heads, int64_t hidden, float scale, Scratch& sc);

#ifdef BF_X86
// attention_bf16.cpp: bf16 storage on bf16 dot products, AMX tiles (tdpbf16ps) when
// amx, else AVX512-BF16 (vdpbf16ps); the caller checked the CPU has them (and, for
// AMX, amx_available()). With amx, the calling thread has configured its tiles
// (amx_tiles_begin) and releases them after its last task (amx_tiles_end).
void run_bf16_task(bool amx, bf16* out, const bf16* qkv, const Sequence& sq, int64_t h, int64_t q0,
                   int64_t num_heads, int64_t hidden, float scale, Scratch& sc);
void amx_tiles_begin();
void amx_tiles_end();

// Whether this process may use AMX bf16 tiles: the CPU has them and (Linux only; no
// AMX elsewhere) the kernel grants the tile state to the process.
bool amx_available();
#endif

}  // namespace attn
}  // namespace cpu
}  // namespace bertfast
