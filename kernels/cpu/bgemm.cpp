// bf16 GEMM for few rows (formulas and the packed layout: kernels/cpu/bgemm.h): what a
// bf16 model's linear layers run on where oneDNN's per-call cost outweighs the
// arithmetic (bertfast/ops/cpu/weights.py routes the rows).
//
// Micro-kernels, chosen per call (the binding resolves the isa):
//   AMX (tdpbf16ps): a task is up to MB rows x two 32-column panels, taken a panel
//     at a time: 16 rows at a time, one A tile (16 rows x 32 k) against the panel's
//     two B tiles (16 k pairs x 16 columns, read straight from the packed panel with
//     a 128-byte stride), two fp32 accumulator tiles, so the panel is read from L1
//     for every 16 rows after the first (against four B tiles of both panels per 16
//     rows, the weights were streamed from L2 for each: 1.02-1.35x slower, results
//     equal bit for bit; notes of 2026-11-29, second session); the activations are
//     copied once per call into a buffer padded to whole tiles (16 rows, K to 32)
//     where they are not already.
//   portable: the same packed weights, fp32 FMAs over each k pair (any CPU; tests).
// Epilogue: the fp32 sums + bias, the activation, one rounding to bf16.
// Threads: OpenMP static split over (row block, panel pair) tasks, panel major, a
// second thread only where the weight stream is worth it (see run_tasks).
#include "cpu/bgemm.h"

#include <cstring>
#include <vector>

#include "cpu/common.h"
#include "cpu/kernels.h"

#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>

#include "cpu/amx.h"
#define BF_BGEMM_AMX 1
#endif

namespace bertfast {
namespace cpu {
namespace {

constexpr int64_t MB = 64;                   // rows per task (a multiple of 16)
constexpr int64_t kTaskCols = 2 * kBPanel;   // columns per task (two panels)
constexpr int64_t kStepBytes = kBPanel * 4;  // bytes of one panel per k pair

struct BArgs {
  const uint16_t* a;  // [M16][lda] activations (AMX: the padded copy)
  int64_t lda;        // elements
  const uint16_t* packed;
  int64_t K2;  // padded K / 2
  int64_t K;   // real K (portable path)
  int64_t M, N;
  uint16_t* out;
  const float* bias;  // fp32, never null
};

// Rows [i0, i0 + rows) x columns [n0, n0 + ncols) from tmp [rows][ld] (every element
// of it written by the caller): the bias added in place, the activation over the
// whole block in one out-of-line loop (activate_inplace<bf16>: an erf GELU is
// gelu_erf_bf16, made for the rounding that follows), then the rounding to bf16.
template <int ACT>
BF_INLINE void epilogue(const BArgs& q, float* tmp, int64_t ld, int rows, int64_t i0, int64_t n0,
                        int64_t ncols) {
  const float* b = q.bias + n0;
  for (int r = 0; r < rows; ++r) {
    float* t = tmp + r * ld;
    for (int64_t j = 0; j < ncols; ++j) t[j] += b[j];
  }
  if (ACT != kNoActivation) activate_inplace<bf16>(ACT, tmp, rows * ld);
  for (int r = 0; r < rows; ++r) {
    const float* t = tmp + r * ld;
    uint16_t* o = q.out + (i0 + r) * q.N + n0;
    for (int64_t j = 0; j < ncols; ++j) o[j] = from_f32<bf16>(t[j]).bits;
  }
}

BF_INLINE void task_bounds(const BArgs& q, int64_t mb, int64_t p, int64_t& n0, int64_t& ncols,
                           int64_t& m_end) {
  n0 = p * kTaskCols;
  ncols = q.N - n0 < kTaskCols ? q.N - n0 : kTaskCols;
  m_end = (mb + 1) * MB < q.M ? (mb + 1) * MB : q.M;
}

template <int ACT>
__attribute__((noinline)) BF_CLONES void task_portable(const BArgs& q, int64_t mb, int64_t p) {
  int64_t n0, ncols, m_end;
  task_bounds(q, mb, p, n0, ncols, m_end);
  alignas(64) float tmp[kTaskCols];
  for (int64_t m = mb * MB; m < m_end; ++m) {
    const uint16_t* a = q.a + m * q.lda;
    for (int64_t c = 0; c < kTaskCols; ++c) tmp[c] = 0.0f;
    for (int64_t c0 = 0; c0 < ncols; c0 += kBPanel) {
      const uint16_t* bp = q.packed + (n0 + c0) / kBPanel * q.K2 * kBPanel * 2;
      float* t = tmp + c0;
      for (int64_t k2 = 0; 2 * k2 < q.K; ++k2) {
        const float a0 = bf16_bits_to_f32(a[2 * k2]);
        const float a1 = 2 * k2 + 1 < q.K ? bf16_bits_to_f32(a[2 * k2 + 1]) : 0.0f;
        const uint16_t* b = bp + k2 * kBPanel * 2;
        for (int64_t c = 0; c < kBPanel; ++c)
          t[c] += a0 * bf16_bits_to_f32(b[2 * c]) + a1 * bf16_bits_to_f32(b[2 * c + 1]);
      }
    }
    epilogue<ACT>(q, tmp, kTaskCols, 1, m, n0, ncols);
  }
}

#ifdef BF_BGEMM_AMX
#define BF_BGEMM_AMX_TARGET \
  __attribute__((target("arch=x86-64-v4,avx512bf16,amx-tile,amx-bf16,prefer-vector-width=512")))

// A task's panels one at a time: 16 rows x the panel's 32 columns per pass over K, one A
// tile (4) against the panel's two B tiles (5, 6) into two accumulators (0, 1), so the
// panel (K x 32 bf16, read straight from the packed panels with a 128-byte stride)
// stays in L1 across the task's row groups; the sums of all of them gathered in tmp
// [MB][32] and the epilogue run once over those. Tiles 0-6 configured by the calling
// thread (amx_begin: once a call in run_tasks, not a task; 2 and 3 unused).
template <int ACT>
BF_BGEMM_AMX_TARGET __attribute__((noinline)) void task_amx(const BArgs& q, int64_t mb, int64_t p) {
  int64_t n0, ncols, m_end;
  task_bounds(q, mb, p, n0, ncols, m_end);
  const int64_t panel_bytes = q.K2 * kStepBytes;
  const int64_t kblocks = q.K2 / 16;
  const int64_t lda_bytes = q.lda * 2;
  const int64_t m0 = mb * MB;
  alignas(64) float tmp[MB * kBPanel];
  for (int64_t c0 = 0; c0 < ncols; c0 += kBPanel) {
    const char* b = reinterpret_cast<const char*>(q.packed) + ((n0 + c0) / kBPanel) * panel_bytes;
    for (int64_t i0 = m0; i0 < m_end; i0 += 16) {
      const char* a = reinterpret_cast<const char*>(q.a + i0 * q.lda);
      _tile_zero(0);
      _tile_zero(1);
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        const int64_t off = kb * 16 * kStepBytes;
        _tile_loadd(4, a + kb * 64, lda_bytes);
        _tile_loadd(5, b + off, kStepBytes);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, b + off + 64, kStepBytes);
        _tile_dpbf16ps(1, 4, 6);
      }
      _tile_stored(0, tmp + (i0 - m0) * kBPanel, kBPanel * 4);
      _tile_stored(1, tmp + (i0 - m0) * kBPanel + 16, kBPanel * 4);
    }
    const int64_t pcols = ncols - c0 < kBPanel ? ncols - c0 : kBPanel;
    epilogue<ACT>(q, tmp, kBPanel, static_cast<int>(m_end - m0), m0, n0 + c0, pcols);
  }
}

// A thread's tiles for its task_amx tasks of one call: configured before the first,
// released after the last (once a task cost more than the tasks of a few rows' GEMM
// can spare).
BF_BGEMM_AMX_TARGET __attribute__((noinline)) void amx_begin() { amx_configure_16x64(7); }
BF_BGEMM_AMX_TARGET __attribute__((noinline)) void amx_end() { _tile_release(); }
#endif  // BF_BGEMM_AMX

template <int ACT>
void run_tasks(const BArgs& q, int isa, int num_threads) {
  const int64_t pairs = (q.N + kTaskCols - 1) / kTaskCols;
  const int64_t mblocks = (q.M + MB - 1) / MB;
  const int64_t tasks = pairs * mblocks;
  // A few rows' GEMM streams its weight from L3 or memory, and that read is what a
  // second thread shares: each weight element counts as 64 rows' multiply-adds.
  const int nt = threads_for((q.M + 64) * q.N * q.K2 * 2, int64_t(1) << 23, num_threads);
  (void)nt;
#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel num_threads(nt)
#endif
  {
#ifdef BF_BGEMM_AMX
    if (isa == kBIsaAmx) amx_begin();
#endif
    const auto task = [&](int64_t t) {
      const int64_t mb = t % mblocks, p = t / mblocks;  // panel major
#ifdef BF_BGEMM_AMX
      if (isa == kBIsaAmx) {
        task_amx<ACT>(q, mb, p);
        return;
      }
#endif
      (void)isa;
      task_portable<ACT>(q, mb, p);
    };
    share_tasks(tasks, /*guided=*/mblocks >= 2, task);  // common.h: why guided
#ifdef BF_BGEMM_AMX
    if (isa == kBIsaAmx) amx_end();
#endif
  }
}

}  // namespace

bool bgemm_cpu_has_amx() {
#ifdef BF_BGEMM_AMX
  return amx_bf16_available();
#else
  return false;
#endif
}

void bgemm_pack(uint16_t* packed, const uint16_t* w, int64_t N, int64_t K, int num_threads) {
  const int64_t K2 = bgemm_padded_k(K) / 2;
  const int64_t panels = (N + kBPanel - 1) / kBPanel;
  const int nt = threads_for(N * K, 1 << 16, num_threads);
  (void)nt;
#ifdef BERTFAST_WITH_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
  for (int64_t p = 0; p < panels; ++p) {
    uint16_t* dst = packed + p * K2 * kBPanel * 2;
    for (int64_t k2 = 0; k2 < K2; ++k2)
      for (int64_t c = 0; c < kBPanel; ++c)
        for (int j = 0; j < 2; ++j) {
          const int64_t n = p * kBPanel + c, k = 2 * k2 + j;
          dst[(k2 * kBPanel + c) * 2 + j] = (n < N && k < K) ? w[n * K + k] : uint16_t(0);
        }
  }
}

void blinear(uint16_t* out, const uint16_t* x, const uint16_t* packed, const uint16_t* bias,
             int64_t M, int64_t N, int64_t K, int activation, int isa, int num_threads) {
  if (M <= 0 || N <= 0) return;
  const int64_t Kp = bgemm_padded_k(K);
  thread_local std::vector<float> bias32;
  if (static_cast<int64_t>(bias32.size()) < N) bias32.resize(N);
  for (int64_t n = 0; n < N; ++n) bias32[n] = bias ? bf16_bits_to_f32(bias[n]) : 0.0f;
  BArgs q{};
  q.a = x;
  q.lda = K;
  q.packed = packed;
  q.K2 = Kp / 2;
  q.K = K;
  q.M = M;
  q.N = N;
  q.out = out;
  q.bias = bias32.data();
  // AMX reads whole tiles: 16 rows of 32 k each; the copy is zero padded.
  thread_local std::vector<uint16_t> padded;
  if (isa == kBIsaAmx && (M % 16 != 0 || Kp != K)) {
    const int64_t M16 = (M + 15) / 16 * 16;
    if (static_cast<int64_t>(padded.size()) < M16 * Kp) padded.resize(M16 * Kp);
    uint16_t* pa = padded.data();
    for (int64_t m = 0; m < M; ++m) {  // each row, then zeros up to Kp; then zero rows
      std::memcpy(pa + m * Kp, x + m * K, static_cast<size_t>(K) * sizeof(uint16_t));
      std::memset(pa + m * Kp + K, 0, static_cast<size_t>(Kp - K) * sizeof(uint16_t));
    }
    std::memset(pa + M * Kp, 0, static_cast<size_t>((M16 - M) * Kp) * sizeof(uint16_t));
    q.a = pa;
    q.lda = Kp;
  }
  dispatch_activation</*kWithNone=*/true>(
      activation, [&](auto act_c) { run_tasks<decltype(act_c)::value>(q, isa, num_threads); });
}

}  // namespace cpu
}  // namespace bertfast
