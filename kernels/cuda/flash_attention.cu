// flash_attention / flash_attention_varlen: a FlashAttention-2-style kernel for
// fp16 and bf16, the "flash" variant of the cuda backend's attention ops (the
// default variant is attention.cu, which also covers fp32).
//
// ---------------------------------------------------------------- contract
// Same as launch_attention (attention.cu):
//
//   out[t, h*D:(h+1)*D] = softmax_j(scale * q_t . k_j + mask_j) v_j   (fp32 softmax)
//
// qkv rows of 3H elements ([Q | K | V], head h at columns h*D of each third), out
// rows of H. Padded: row b*S + s, optional byte mask [B, S] (nonzero = real
// token); varlen: sequence b is rows cu_seqlens[b] .. cu_seqlens[b+1] (clamped
// into [0, total_tokens], so any cu_seqlens is memory-safe). Masked keys and keys
// past the sequence end are never read (zero-filled in shared memory) and get
// score -inf; a key tile with no real key is skipped. Rows of padded queries and
// of all-masked sequences are zero. Non-finite inputs propagate as in torch's
// SDPA: a NaN / +inf score makes its p (exp2(NaN), exp2(inf - inf)) and so its
// row NaN; a row whose real scores are all -inf has l == 0 and is written as
// P V = 0 (NaN where V holds inf or NaN, 0 * inf), as the other backends do.
//
// ---------------------------------------------------------------- launch
// 256 threads = 8 warps per CTA; a CTA owns one tile of BLOCK_M = 128 query rows
// of one (sequence, head), a warp 16 of those rows. Grid (query tiles, heads):
//   padded: tile t is query tile t % ceil(S/128) of sequence t / ceil(S/128);
//   varlen: a one-CTA prologue (varlen_tiles_kernel) turns cu_seqlens into a
//     table tile -> (sequence, query tile) over the real tiles only (prefix sum of
//     ceil(len_b / 128)); the main grid is sized by the host-side upper bound
//     sum_b ceil(len_b / 128) <= ceil(T / 128) + B (no read of cu_seqlens on the
//     host, no sync), and CTAs past the real count exit at once. No CTA is spent
//     on the empty tiles of a (max_seqlen / 128) x B grid.
// Why 8 warps x 16 rows rather than 4 x 32: per thread, Q fragments (D/4
// registers), the output accumulator (D/2) and the scores (BLOCK_N/2 = 32) are
// held across the key loop; 32 rows per warp doubles all three (for D = 128:
// 64 + 128 + 64 > 255 registers, spills). With 16 rows per warp D = 80 .. 128
// take 148 .. 206 registers (one CTA of 8 warps per SM) and D <= 64 fits in 128
// (two CTAs, 16 warps per SM: __launch_bounds__(256, 2)), all without spills on
// sm_80 and sm_90 (benchmarks/results/cuda-resources.md). Every warp reads the
// key mask and finds the next non-empty key tile itself (ballots over 64 mask
// bytes), so the CTA needs no barrier for that and stays in lockstep.
//
// ---------------------------------------------------------------- tiling
// The CTA streams BLOCK_N = 64 keys at a time through two shared-memory stages
// (K tile then V tile, 64 rows each), filled with 16-byte cp.async.cg copies
// (src-size 0 for a masked / out-of-range row: 16 zero bytes written, nothing
// read). Q (128 rows) is first copied into stage 1, read once into registers
// with ldmatrix, and stage 1 is then free for the key tiles. Per key tile:
//   wait for tile i, __syncthreads, issue tile i+1 into the other stage (its
//   previous contents were consumed before this barrier), compute tile i:
//   S = Q K^T (mma.sync m16n8k16, fp32 accumulate, in registers), online
//   softmax on S in registers, P converted in registers into the A operand of
//   P V, O += P V (fp32 registers). One barrier per tile; the copy of tile i+1
//   runs under the math of tile i.
// At the end O is divided by the row sum l, written through shared memory
// (stage 0, each warp its own 16 rows) and stored to global with 16-byte stores.
//
// Shared rows are padded to D + 8 elements: a row is D/8 + 1 16-byte chunks, an
// odd number, so the 8 row addresses of an 8x8 ldmatrix (same chunk column, 8
// consecutive rows) land in 8 distinct 16-byte bank groups: conflict-free for
// every head dim, 80 and 96 included (an XOR swizzle needs a power-of-two
// number of chunks per row).
//
// ---------------------------------------------------------------- mma layouts
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32; lane l,
// g = l / 4 (group), c = l % 4 (thread in group). A 32-bit register holds two
// 16-bit elements, the lower column / k index in the low half.
//   A (16 x 16, row-major), 4 registers:
//     a0 = A[g][2c, 2c+1]      a1 = A[g+8][2c, 2c+1]
//     a2 = A[g][2c+8, 2c+9]    a3 = A[g+8][2c+8, 2c+9]
//   B (16 x 8, k x n), 2 registers:
//     b0 = B[2c, 2c+1][g]      b1 = B[2c+8, 2c+9][g]
//   C / D (16 x 8, fp32), 4 registers:
//     d0, d1 = D[g][2c, 2c+1]  d2, d3 = D[g+8][2c, 2c+1]
// ldmatrix.m8n8.x4 (.b16): lanes 8i .. 8i+7 give the row addresses of matrix i
// (8 rows of 16 bytes); register ri of lane l receives matrix i's elements
// (row g, columns 2c, 2c+1); with .trans it receives (rows 2c, 2c+1, column g).
// So, for a 16 x 16 operand at (r0, c0) of a row-major shared tile:
//   Q as A:      lane l addresses row r0 + l % 16, column c0 + (l / 16) * 8:
//                r0..r3 = a0..a3.
//   K as B of S = Q K^T (B[d][j] = K[j][d], K stored by key): lane l addresses
//                key j0 + (l / 16) * 8 + l % 8, dim d0 + ((l / 8) % 2) * 8; no
//                .trans: r0, r1 = b0, b1 of keys j0..j0+7, r2, r3 = b0, b1 of
//                keys j0+8..j0+15.
//   V as B of O = P V (B[j][d] = V[j][d], V stored by key): lane l addresses key
//                j0 + ((l / 8) % 2) * 8 + l % 8, dim d0 + (l / 16) * 8, with
//                .trans: r0, r1 = b0, b1 of dims d0..d0+7, r2, r3 = b0, b1 of
//                dims d0+8..d0+15.
// P reuse: the accumulator of S for keys 8n .. 8n+7 holds, in lane l, P[g][8n +
// 2c, +1] (d0, d1) and P[g+8][8n + 2c, +1] (d2, d3). The A operand of P V for keys
// 16k .. 16k+15 needs a0 = P[g][16k + 2c, +1], a1 = P[g+8][16k + 2c, +1],
// a2 = P[g][16k + 8 + 2c, +1], a3 = P[g+8][16k + 8 + 2c, +1], i.e.
//   a0 = pack(S[2k].d0, S[2k].d1)      a1 = pack(S[2k].d2, S[2k].d3)
//   a2 = pack(S[2k+1].d0, S[2k+1].d1)  a3 = pack(S[2k+1].d2, S[2k+1].d3)
// in the same lane: no data moves between lanes, nothing goes through shared
// memory. Each lane owns rows g and g+8 of its warp's 16; the four lanes of a
// group share them, so row max and row sum reduce over lanes l ^ 1, l ^ 2.
//
// ---------------------------------------------------------------- softmax
// Scores in log2 units, x = s * scale * log2(e); per row the running max m and
// a per-lane partial sum l (the four lanes' parts are added at the end; they
// are all rescaled by the same factor). Per tile: m_new = max(m, max_j x_j);
// m_use = m_new, or 0 while m_new is -inf (every score so far -inf: keeps p = 0
// and alpha = 0 instead of exp2(-inf + inf) = NaN); alpha = exp2(m - m_use);
// p_j = exp2(x_j - m_use) rounded to the storage type (the P the P V product
// uses); l = l * alpha + sum_j p_j (of the rounded p); O = O * alpha + P V.
// Output row = O / l, or O when l == 0 (O is then 0, or NaN from 0 * inf).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "launchers.cuh"

namespace bertfast {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kWarpRows = 16;                // query rows per warp (one m16 tile)
constexpr int kBlockM = kWarps * kWarpRows;  // 128 query rows per CTA
constexpr int kBlockN = 64;                  // keys per tile
constexpr float kLog2e = 1.4426950408889634f;

struct FlashParams {
  const void* qkv;
  void* out;
  const uint8_t* mask;        // padded only; may be null
  const int32_t* cu_seqlens;  // varlen only (null for padded)
  const int2* tile_table;     // varlen: (sequence, query tile) per CTA, sequence -1: none
  int64_t seqlen;             // padded: S
  int64_t tiles_per_seq;      // padded: ceil(S / BLOCK_M)
  int64_t total_tokens;       // rows of qkv / out
  int hidden;                 // H = heads * D
  float scale_log2;           // scale * log2(e)
};

template <typename T, int D>
struct FlashConfig {
  static_assert(D % 16 == 0, "head_dim must be a multiple of 16 (k-steps of the mma)");
  static constexpr int kLd = D + 8;                                     // shared row, elements
  static constexpr int kChunks = D * static_cast<int>(sizeof(T)) / 16;  // 16-byte chunks a row
  static constexpr int kTileBytes = kBlockN * kLd * static_cast<int>(sizeof(T));  // K or V
  static constexpr int kStageBytes = 2 * kTileBytes;  // K then V; also holds Q (128 rows)
  static constexpr int kSmemBytes = 2 * kStageBytes;
  // Two CTAs (16 warps) per SM where the registers allow it (128 per thread).
  static constexpr int kMinBlocks = D <= 64 ? 2 : 1;
  static_assert(kStageBytes == kBlockM * kLd * static_cast<int>(sizeof(T)), "Q fits a stage");
};

// ---------------------------------------------------------------- PTX wrappers
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; src_bytes 0 writes 16 zero bytes and
// reads nothing (src must still be a valid address: callers pass an in-range one).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const uint32_t src_bytes = valid ? 16u : 0u;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a b for one m16n8k16 tile (fp32 accumulate).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same<T, __half>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// 2^x on the SFU: exp2(-inf) = 0, exp2(NaN) = NaN, results below 2^-126 flush to 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// (lo, hi) rounded to T and packed, lo in the low half; lo_r / hi_r: the rounded
// values back in fp32.
template <typename T>
__device__ __forceinline__ uint32_t pack_round(float lo, float hi, float& lo_r, float& hi_r) {
  uint32_t bits;
  if constexpr (std::is_same<T, __half>::value) {
    const __half2 h = __floats2half2_rn(lo, hi);
    const float2 f = __half22float2(h);
    lo_r = f.x;
    hi_r = f.y;
    bits = *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    const float2 f = __bfloat1622float2(h);
    lo_r = f.x;
    hi_r = f.y;
    bits = *reinterpret_cast<const uint32_t*>(&h);
  }
  return bits;
}

template <typename T>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  float a, b;
  return pack_round<T>(lo, hi, a, b);
}

// ---------------------------------------------------------------- key tiles
// A key tile: its first key and which of its 64 keys are real (bit r: key j + r
// is inside the sequence and unmasked).
struct KeyTile {
  int j;
  unsigned long long bits;
};

// The first key tile at or after key j (a multiple of BLOCK_N) with a real key;
// j = len when there is none. Every warp computes it for itself (same answer in
// all warps: the CTA's control flow stays uniform without a barrier).
__device__ __forceinline__ KeyTile next_key_tile(int j, int len, const uint8_t* __restrict__ mask,
                                                 int lane) {
  for (; j < len; j += kBlockN) {
    unsigned long long bits;
    const int n = len - j;
    if (mask == nullptr) {
      bits = n >= 64 ? ~0ull : (1ull << n) - 1;
    } else {
      const bool lo = lane < n && mask[j + lane] != 0;
      const bool hi = lane + 32 < n && mask[j + 32 + lane] != 0;
      bits = static_cast<unsigned long long>(__ballot_sync(0xffffffffu, lo)) |
             (static_cast<unsigned long long>(__ballot_sync(0xffffffffu, hi)) << 32);
    }
    if (bits != 0) return {j, bits};
  }
  return {len, 0ull};
}

// Copies K and V rows j .. j+63 of the sequence into one stage (K tile, then V
// tile); row r is zero-filled unless bit r of `bits` is set.
template <typename T, int D>
__device__ __forceinline__ void load_kv_tile(uint32_t stage, const T* __restrict__ k_base,
                                             int hidden, int64_t stride, const KeyTile& kt,
                                             const void* safe_src) {
  using Cfg = FlashConfig<T, D>;
  constexpr int kTotal = kBlockN * Cfg::kChunks;
  constexpr int kElems = 16 / static_cast<int>(sizeof(T));  // per 16-byte chunk
  constexpr int kBytes = static_cast<int>(sizeof(T));
#pragma unroll
  for (int i = 0; i < (kTotal + kThreads - 1) / kThreads; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    if (kTotal % kThreads == 0 || idx < kTotal) {
      const int r = idx / Cfg::kChunks;
      const int c = idx - r * Cfg::kChunks;
      const bool ok = (kt.bits >> r) & 1ull;
      const int64_t off = static_cast<int64_t>(kt.j + r) * stride + c * kElems;
      const uint32_t dst = stage + (r * Cfg::kLd + c * kElems) * kBytes;
      cp_async_16(dst, ok ? static_cast<const void*>(k_base + off) : safe_src, ok);
      cp_async_16(dst + Cfg::kTileBytes,
                  ok ? static_cast<const void*>(k_base + off + hidden) : safe_src, ok);
    }
  }
}

// ---------------------------------------------------------------- the CTA
template <typename T, int D>
__device__ __forceinline__ void flash_attention_cta(const FlashParams& p) {
  using Cfg = FlashConfig<T, D>;
  constexpr int kDSteps = D / 16;        // k-steps of S = Q K^T
  constexpr int kDTiles = D / 8;         // n-tiles of O
  constexpr int kNTiles = kBlockN / 8;   // n-tiles of S
  constexpr int kPSteps = kBlockN / 16;  // k-steps of O += P V
  constexpr int kElemsPerChunk = 16 / static_cast<int>(sizeof(T));
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;  // group: rows g and g + 8 of the warp's 16
  const int c = lane & 3;   // thread in group: columns 2c, 2c + 1 of each n8 tile
  const int head = blockIdx.y;

  // ------------------------------------------------ which tile
  int64_t tok0;  // first row of the sequence in qkv / out
  int len;       // rows of the sequence
  int q0;        // first query row of this tile, within the sequence
  const uint8_t* mask = nullptr;
  if (p.cu_seqlens != nullptr) {
    const int2 e = p.tile_table[blockIdx.x];
    if (e.x < 0) return;  // past the real tiles (uniform over the CTA)
    int64_t start = p.cu_seqlens[e.x];
    int64_t end = p.cu_seqlens[e.x + 1];
    // The prologue clamped the same way: any cu_seqlens stays in bounds.
    start = start < 0 ? 0 : (start > p.total_tokens ? p.total_tokens : start);
    end = end < start ? start : (end > p.total_tokens ? p.total_tokens : end);
    tok0 = start;
    len = static_cast<int>(end - start > kMaxCudaSeqLen ? kMaxCudaSeqLen : end - start);
    q0 = e.y * kBlockM;
  } else {
    const int64_t b = blockIdx.x / p.tiles_per_seq;
    tok0 = b * p.seqlen;
    len = static_cast<int>(p.seqlen);
    q0 = static_cast<int>(blockIdx.x - b * p.tiles_per_seq) * kBlockM;
    if (p.mask != nullptr) mask = p.mask + b * p.seqlen;
  }
  if (q0 >= len) return;  // (not reached for a consistent table; uniform)

  const int64_t stride = 3LL * p.hidden;
  const T* qkv = static_cast<const T*>(p.qkv);
  const T* q_base = qkv + tok0 * stride + static_cast<int64_t>(head) * D;
  const T* k_base = q_base + p.hidden;  // V at k_base + H

  // Real query rows of this warp: bit r <-> row q0 + warp * 16 + r. What only
  // the epilogue needs waits in shared memory, not in registers across the key
  // loop (where it would push D = 64 past the 128 registers of two CTAs per SM).
  __shared__ int64_t s_tok0;
  __shared__ int s_q0;
  __shared__ uint32_t s_row_bits[kWarps];
  bool warp_active;  // any real query row in this warp (warp-uniform)
  {
    const int qw = q0 + warp * kWarpRows;
    const bool my_row =
        lane < kWarpRows && qw + lane < len && (mask == nullptr || mask[qw + lane] != 0);
    const uint32_t row_bits = __ballot_sync(0xffffffffu, my_row);
    warp_active = row_bits != 0;
    if (lane == 0) s_row_bits[warp] = row_bits;
    if (tid == 0) {
      s_tok0 = tok0;
      s_q0 = q0;
    }
  }

  KeyTile cur = next_key_tile(0, len, mask, lane);
  // A tile of padded queries only (or, defensively, a sequence without a real
  // key): zeros, no work. Both conditions are uniform over the CTA.
  if (!__syncthreads_or(warp_active) || cur.j >= len) {
    T* out = static_cast<T*>(p.out) + tok0 * p.hidden + static_cast<int64_t>(head) * D;
    const int rows = len - q0 < kBlockM ? len - q0 : kBlockM;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    for (int idx = tid; idx < rows * Cfg::kChunks; idx += kThreads) {
      const int r = idx / Cfg::kChunks;
      const int ch = idx - r * Cfg::kChunks;
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(q0 + r) * p.hidden +
                                ch * kElemsPerChunk) = zero;
    }
    return;
  }

  const uint32_t stage0 = smem_addr(smem);  // stage s at stage0 + s * kStageBytes
  const uint32_t stage1 = stage0 + Cfg::kStageBytes;

  // ------------------------------------------------ prologue: Q -> stage 1, tile 0 -> stage 0
  {
    constexpr int kTotal = kBlockM * Cfg::kChunks;
    static_assert(kTotal % kThreads == 0, "Q copies divide evenly over the threads");
#pragma unroll
    for (int i = 0; i < kTotal / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      const int r = idx / Cfg::kChunks;
      const int ch = idx - r * Cfg::kChunks;
      const bool ok = q0 + r < len;
      const T* src = q_base + static_cast<int64_t>(q0 + r) * stride + ch * kElemsPerChunk;
      cp_async_16(stage1 + (r * Cfg::kLd + ch * kElemsPerChunk) * static_cast<int>(sizeof(T)),
                  ok ? static_cast<const void*>(src) : p.qkv, ok);
    }
  }
  cp_async_commit();
  load_kv_tile<T, D>(stage0, k_base, p.hidden, stride, cur, p.qkv);
  cp_async_commit();
  KeyTile nxt = next_key_tile(cur.j + kBlockN, len, mask, lane);

  // Per lane: its ldmatrix row offsets (bytes) inside a tile, see the header.
  const uint32_t ld_bytes = Cfg::kLd * sizeof(T);
  const uint32_t q_lane = (warp * kWarpRows + (lane & 15)) * ld_bytes + (lane >> 4) * 16;
  const uint32_t k_lane = ((lane >> 4) * 8 + (lane & 7)) * ld_bytes + ((lane >> 3) & 1) * 16;
  const uint32_t v_lane = (((lane >> 3) & 1) * 8 + (lane & 7)) * ld_bytes + (lane >> 4) * 16;

  uint32_t qf[kDSteps][4];  // this warp's 16 x D query rows as A fragments
  float o[kDTiles][4];      // output accumulator (fp32)
#pragma unroll
  for (int n = 0; n < kDTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY;  // running max of rows g, g + 8 (log2 units)
  float l0 = 0.f, l1 = 0.f;              // this lane's part of their running sums

  cp_async_wait_all();
  __syncthreads();  // Q and tile 0 are in shared memory
  if (warp_active) {
#pragma unroll
    for (int kk = 0; kk < kDSteps; ++kk) ldmatrix_x4(qf[kk], stage1 + q_lane + kk * 32);
  }
  __syncthreads();  // Q is in registers: stage 1 is free

  int stage = 0;
  for (;;) {
    const bool more = nxt.j < len;
    if (more) {
      load_kv_tile<T, D>(stage0 + (stage ^ 1) * Cfg::kStageBytes, k_base, p.hidden, stride, nxt,
                         p.qkv);
      cp_async_commit();
    }

    if (warp_active) {
      const uint32_t k_tile = stage0 + stage * Cfg::kStageBytes;
      const uint32_t v_tile = k_tile + Cfg::kTileBytes;

      // ---------------- S = Q K^T: 16 x 64 per warp, fp32 in registers
      float s[kNTiles][4];
#pragma unroll
      for (int n = 0; n < kNTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kDSteps; ++kk) {
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, k_tile + k_lane + np * 16 * ld_bytes + kk * 32);
          mma_16816<T>(s[2 * np], qf[kk], b[0], b[1]);
          mma_16816<T>(s[2 * np + 1], qf[kk], b[2], b[3]);
        }
      }

      // ---------------- online softmax (rows g: s[n][0..1], g + 8: s[n][2..3])
#pragma unroll
      for (int n = 0; n < kNTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= p.scale_log2;
      if (cur.bits != ~0ull) {  // masked or out-of-range keys: -inf (warp-uniform branch)
        const unsigned long long kb = cur.bits >> (2 * c);  // bit 8n + e <-> key 8n + 2c + e
#pragma unroll
        for (int n = 0; n < kNTiles; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!((kb >> (8 * n + (e & 1))) & 1ull)) s[n][e] = -INFINITY;
      }
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
        mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      const float m_new0 = fmaxf(m0, mx0);
      const float m_new1 = fmaxf(m1, mx1);
      const float mu0 = m_new0 == -INFINITY ? 0.f : m_new0;
      const float mu1 = m_new1 == -INFINITY ? 0.f : m_new1;
      const float alpha0 = fast_exp2(m0 - mu0);
      const float alpha1 = fast_exp2(m1 - mu1);
      m0 = m_new0;
      m1 = m_new1;

      // P in registers as the A operands of P V (see "P reuse" in the header).
      uint32_t pa[kPSteps][4];
      float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
      for (int kk = 0; kk < kPSteps; ++kk) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float* sn = s[2 * kk + h];
          float r00, r01, r10, r11;
          pa[kk][2 * h] = pack_round<T>(fast_exp2(sn[0] - mu0), fast_exp2(sn[1] - mu0), r00, r01);
          pa[kk][2 * h + 1] =
              pack_round<T>(fast_exp2(sn[2] - mu1), fast_exp2(sn[3] - mu1), r10, r11);
          sum0 += r00 + r01;
          sum1 += r10 + r11;
        }
      }
      l0 = l0 * alpha0 + sum0;
      l1 = l1 * alpha1 + sum1;
#pragma unroll
      for (int n = 0; n < kDTiles; ++n) {
        o[n][0] *= alpha0;
        o[n][1] *= alpha0;
        o[n][2] *= alpha1;
        o[n][3] *= alpha1;
      }

      // ---------------- O += P V
#pragma unroll
      for (int kk = 0; kk < kPSteps; ++kk) {
#pragma unroll
        for (int dp = 0; dp < kDTiles / 2; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_tile + v_lane + kk * 16 * ld_bytes + dp * 32);
          mma_16816<T>(o[2 * dp], pa[kk], b[0], b[1]);
          mma_16816<T>(o[2 * dp + 1], pa[kk], b[2], b[3]);
        }
      }
    }

    if (!more) break;
    cur = nxt;
    nxt = next_key_tile(cur.j + kBlockN, len, mask, lane);
    cp_async_wait_all();
    __syncthreads();  // tile `cur` is visible; everyone is done with the other stage
    stage ^= 1;
  }

  // ------------------------------------------------ epilogue: O / l -> out
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  // l == 0: no real key, or every real score -inf: O is then 0 (NaN where V is
  // inf or NaN), written as it is. Padded query rows: 0.
  const float inv0 = l0 == 0.f ? 1.f : 1.f / l0;
  const float inv1 = l1 == 0.f ? 1.f : 1.f / l1;
  const uint32_t row_bits = s_row_bits[warp];
  const bool valid0 = (row_bits >> g) & 1u;
  const bool valid1 = (row_bits >> (g + 8)) & 1u;
  const int qw = s_q0 + warp * kWarpRows;
  T* out = static_cast<T*>(p.out) + s_tok0 * p.hidden + static_cast<int64_t>(head) * D;

  __syncthreads();  // every warp is done reading the stages
  // Staging: this warp's 16 rows at the start of stage 0 (rows warp * 16 ..).
  unsigned char* stage_rows = smem + warp * kWarpRows * ld_bytes;
#pragma unroll
  for (int n = 0; n < kDTiles; ++n) {
    const int col = 8 * n + 2 * c;
    *reinterpret_cast<uint32_t*>(stage_rows + g * ld_bytes + col * sizeof(T)) =
        pack<T>(valid0 ? o[n][0] * inv0 : 0.f, valid0 ? o[n][1] * inv0 : 0.f);
    *reinterpret_cast<uint32_t*>(stage_rows + (g + 8) * ld_bytes + col * sizeof(T)) =
        pack<T>(valid1 ? o[n][2] * inv1 : 0.f, valid1 ? o[n][3] * inv1 : 0.f);
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < (kWarpRows * Cfg::kChunks + 31) / 32; ++i) {
    const int idx = lane + 32 * i;
    const int r = idx / Cfg::kChunks;
    const int ch = idx - r * Cfg::kChunks;
    const int q = qw + r;
    if (idx < kWarpRows * Cfg::kChunks && q < len) {
      const uint4 v = *reinterpret_cast<const uint4*>(stage_rows + r * ld_bytes + ch * 16);
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(q) * p.hidden + ch * kElemsPerChunk) = v;
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, FlashConfig<T, D>::kMinBlocks)
    flash_attention_kernel(const FlashParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // cp.async and bf16 mma need sm_80; builds that add older archs still compile,
  // and bertfast/ops/cuda.py never offers this kernel on such a device.
  __trap();
#else
  flash_attention_cta<T, D>(p);
#endif
}

// ---------------------------------------------------------------- varlen prologue
constexpr int kPrologueThreads = 1024;

__device__ __forceinline__ int64_t query_tiles_of(const int32_t* __restrict__ cu_seqlens, int64_t b,
                                                  int64_t total_tokens) {
  int64_t start = cu_seqlens[b];
  int64_t end = cu_seqlens[b + 1];
  start = start < 0 ? 0 : (start > total_tokens ? total_tokens : start);
  end = end < start ? start : (end > total_tokens ? total_tokens : end);
  const int64_t len = end - start > kMaxCudaSeqLen ? kMaxCudaSeqLen : end - start;
  return (len + kBlockM - 1) / kBlockM;
}

__device__ __forceinline__ int32_t saturate_i32(int64_t v) {
  return static_cast<int32_t>(v > 0x7fffffffLL ? 0x7fffffffLL : v);
}

// One CTA: tile_start[b] = sum_{b' < b} ceil(len_b' / BLOCK_M) (saturated to
// int32), then tile_table[t] = (b, t - tile_start[b]) for each real tile t <
// num_tiles and (-1, -1) for the rest of the grid's num_tiles entries.
__global__ void __launch_bounds__(kPrologueThreads)
    varlen_tiles_kernel(const int32_t* __restrict__ cu_seqlens, int64_t batch, int64_t total_tokens,
                        int64_t num_tiles, int2* __restrict__ tile_table,
                        int32_t* __restrict__ tile_start) {
  __shared__ int64_t warp_total[kPrologueThreads / 32];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int64_t chunk = (batch + kPrologueThreads - 1) / kPrologueThreads;
  const int64_t b0 = tid * chunk < batch ? tid * chunk : batch;
  const int64_t b1 = b0 + chunk < batch ? b0 + chunk : batch;

  int64_t mine = 0;
  for (int64_t b = b0; b < b1; ++b) mine += query_tiles_of(cu_seqlens, b, total_tokens);
  // Block-wide inclusive scan of `mine`: within warps, then over the warp totals.
  int64_t incl = mine;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int64_t v = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int64_t w = warp_total[lane];
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int64_t v = __shfl_up_sync(0xffffffffu, w, off);
      if (lane >= off) w += v;
    }
    warp_total[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  int64_t run = (warp > 0 ? warp_total[warp - 1] : 0) + incl - mine;
  for (int64_t b = b0; b < b1; ++b) {
    tile_start[b] = saturate_i32(run);
    run += query_tiles_of(cu_seqlens, b, total_tokens);
  }
  const int64_t total = warp_total[kPrologueThreads / 32 - 1];
  if (tid == 0) tile_start[batch] = saturate_i32(total);
  __syncthreads();  // tile_start (global) is visible to the whole CTA

  for (int64_t t = tid; t < num_tiles; t += kPrologueThreads) {
    int2 e = make_int2(-1, -1);
    if (t < total) {
      // The last b with tile_start[b] <= t; tile_start[0] == 0 <= t, and
      // tile_start[batch] = total > t, so b < batch and t is one of b's tiles.
      int64_t lo = 0, hi = batch - 1;
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) >> 1;
        if (tile_start[mid] <= t) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      e = make_int2(static_cast<int>(lo), static_cast<int>(t - tile_start[lo]));
    }
    tile_table[t] = e;
  }
}

template <typename T, int D>
cudaError_t flash_attention_typed(const FlashParams& p, int64_t grid_tiles, int num_heads,
                                  cudaStream_t stream) {
  using Cfg = FlashConfig<T, D>;
  constexpr int smem = Cfg::kSmemBytes;
  if constexpr (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(flash_attention_kernel<T, D>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(static_cast<unsigned>(grid_tiles), static_cast<unsigned>(num_heads));
  flash_attention_kernel<T, D><<<grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

// The varlen grid: sum_b ceil(len_b / BLOCK_M) <= sum_b (len_b / BLOCK_M + 1)
// <= T / BLOCK_M + B for lengths that partition the T rows.
int64_t varlen_grid_tiles(int64_t batch, int64_t total_tokens) {
  return (total_tokens + kBlockM - 1) / kBlockM + batch;
}

}  // namespace

int64_t flash_attention_scratch_ints(int64_t batch, int64_t total_tokens) {
  return 2 * varlen_grid_tiles(batch, total_tokens) + batch + 1;
}

cudaError_t launch_flash_attention(void* out, const void* qkv, const uint8_t* mask,
                                   const int32_t* cu_seqlens, int32_t* scratch, int64_t batch,
                                   int64_t seqlen, int64_t total_tokens, int num_heads,
                                   int head_dim, float scale, int dtype, cudaStream_t stream) {
  if (num_heads < 1 || num_heads > kMaxGridYZ || batch < 0 || seqlen < 0 ||
      seqlen > kMaxCudaSeqLen || total_tokens < 0 || total_tokens > kMaxCudaRows)
    return cudaErrorInvalidValue;
  if (dtype != kFloat16 && dtype != kBFloat16) return cudaErrorInvalidValue;
  // 16-byte cp.async of every row: base, row stride 3H and head offsets h*D must
  // be multiples of 16 bytes (D * 2 bytes is, for every compiled D).
  const int64_t hidden = static_cast<int64_t>(num_heads) * head_dim;
  if (!is_aligned16(qkv) || !is_aligned16(out) || (hidden * 2) % 16 != 0)
    return cudaErrorMisalignedAddress;
  if (batch == 0 || total_tokens == 0) return cudaSuccess;

  FlashParams p;
  p.qkv = qkv;
  p.out = out;
  p.mask = cu_seqlens == nullptr ? mask : nullptr;
  p.cu_seqlens = cu_seqlens;
  p.tile_table = nullptr;
  p.seqlen = seqlen;
  p.tiles_per_seq = (seqlen + kBlockM - 1) / kBlockM;
  p.total_tokens = total_tokens;
  p.hidden = static_cast<int>(hidden);
  p.scale_log2 = scale * kLog2e;

  int64_t grid_tiles;
  if (cu_seqlens != nullptr) {
    if (scratch == nullptr) return cudaErrorInvalidValue;
    grid_tiles = varlen_grid_tiles(batch, total_tokens);
    int2* table = reinterpret_cast<int2*>(scratch);  // 2 * grid_tiles ints, 8-byte aligned
    int32_t* tile_start = scratch + 2 * grid_tiles;  // batch + 1 ints
    varlen_tiles_kernel<<<1, kPrologueThreads, 0, stream>>>(cu_seqlens, batch, total_tokens,
                                                            grid_tiles, table, tile_start);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    p.tile_table = table;
  } else {
    if (seqlen == 0) return cudaSuccess;
    grid_tiles = batch * p.tiles_per_seq;
  }
  if (grid_tiles > 0x7fffffffLL) return cudaErrorInvalidValue;

  return dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same<T, float>::value) {
      return cudaErrorInvalidValue;  // fp32 runs attention.cu
    } else {
      // Instantiated for exactly the head dims of constants.h; any other is rejected.
      return dispatch_int(CudaFlashAttentionHeadDims{}, head_dim, [&](auto d) {
        return flash_attention_typed<T, decltype(d)::value>(p, grid_tiles, num_heads, stream);
      });
    }
  });
}

}  // namespace cuda
}  // namespace bertfast
