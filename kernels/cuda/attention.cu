// attention / attention_varlen: flash-style fused multi-head self-attention that
// reads the fused QKV projection directly and writes heads merged.
//
//   out[t, h*D:(h+1)*D] = softmax_j(scale * q_t . k_j + mask_j) v_j   (fp32 softmax)
//
// Layout: qkv rows of 3H elements ([Q | K | V], head h at columns h*D of each
// third), out rows of H; padded: row b*S + s with a byte mask [B, S] (nonzero =
// real token, may be null); varlen: sequence b is rows cu_seqlens[b] ..
// cu_seqlens[b+1]. Rows of padded queries (and of all-masked sequences) are zero.
//
// Launch: grid (ceil(max_len / BLOCK_M), heads, batch), 128 threads = 4 warps, a
// warp per 16 query rows (BLOCK_M = 64). The CTA keeps its Q tile in shared memory
// and streams BLOCK_N keys at a time: K and V tiles into shared memory (rows that
// are masked or past the end are zero-filled and get a -inf key bias); each warp
// computes its 16 x BLOCK_N scores into shared memory, runs the online softmax
// (running max m and sum l per row, two lanes per row, exp2 with the scale folded
// into log2 units), writes P in the storage type, rescales its output accumulator
// by exp2(m_old - m_new) and adds P V. Key tiles that are entirely masked are
// skipped. Nothing of size [S, S] ever reaches global memory.
//   fp16/bf16: both products on tensor cores (nvcuda::wmma 16x16x16, fp32
//     accumulate); the output accumulator lives in wmma fragments, rescaled row
//     by row through a fragment that holds each element's row index (read once
//     from a 16 x 16 matrix of row numbers, so no fragment layout is assumed).
//   fp32: CUDA cores, fp32 throughout (no TF32); lane l owns key columns l + 32i
//     of the scores and output columns l + 32i of its 16 rows.
#include <mma.h>

#include <cmath>
#include <type_traits>

#include "common.cuh"
#include "launchers.cuh"

namespace bertfast {
namespace cuda {
namespace {

using namespace nvcuda;

constexpr int kThreads = 128;
constexpr int kWarpRows = 16;                         // query rows per warp
constexpr int kBlockM = kWarpRows * (kThreads / 32);  // query rows per CTA
constexpr float kLog2e = 1.4426950408889634f;

struct AttnParams {
  const void* qkv;
  void* out;
  const uint8_t* mask;        // padded only; may be null
  const int32_t* cu_seqlens;  // varlen only (null for padded)
  int64_t seqlen;             // padded: S; varlen: max_seqlen (sizes the grid only)
  int64_t total_tokens;       // rows of qkv / out
  int hidden;                 // H = heads * D
  float scale_log2;           // scale * log2(e)
};

constexpr size_t round128(size_t n) { return (n + 127) / 128 * 128; }

template <typename T, int D>
struct AttnConfig {
  static_assert(D % 16 == 0, "head_dim must be a multiple of 16");
  static constexpr bool kTensorCores = !std::is_same<T, float>::value;
  static constexpr int kBlockN = kTensorCores ? 64 : 32;
  // Leading dimensions (elements). Tensor-core tiles: rows padded by 8 elements
  // (16 bytes) so consecutive rows start in different banks, and every 16-row /
  // 16-column fragment start stays 32-byte aligned as wmma requires. fp32: K rows
  // padded by one float (lane l reads row l: conflict-free), Q and V unpadded
  // (Q is read as broadcast float4, V along rows).
  static constexpr int kLdQ = kTensorCores ? D + 8 : D;
  static constexpr int kLdK = kTensorCores ? D + 8 : D + 1;
  static constexpr int kLdV = kTensorCores ? D + 8 : D;
  static constexpr int kLdS = kBlockN + 4;                               // float scores
  static constexpr int kLdP = kTensorCores ? kBlockN + 8 : kBlockN + 4;  // T probabilities

  static constexpr size_t kQOff = 0;
  static constexpr size_t kKOff = kQOff + round128(sizeof(T) * kBlockM * kLdQ);
  static constexpr size_t kVOff = kKOff + round128(sizeof(T) * kBlockN * kLdK);
  static constexpr size_t kSOff = kVOff + round128(sizeof(T) * kBlockN * kLdV);
  static constexpr size_t kPOff = kSOff + round128(sizeof(float) * kBlockM * kLdS);
  static constexpr size_t kKeyBiasOff = kPOff + round128(sizeof(T) * kBlockM * kLdP);
  static constexpr size_t kAlphaOff = kKeyBiasOff + round128(sizeof(float) * kBlockN);
  // 1 / l per row after the last tile reuses the alpha buffer (per warp, after a
  // __syncwarp): keeps fp16/bf16 D=64 at 53.5 KiB, three CTAs per A100 SM.
  static constexpr size_t kSmemBytes = kAlphaOff + round128(sizeof(float) * kBlockM);
};

// Copies ROWS rows of D elements (row r at src + r * src_stride) into shared
// memory with leading dimension LD, 16 bytes per access; rows for which
// row_ok(r) is false are zero-filled. src rows are 16-byte aligned (checked by
// the launcher: base pointer, H and D * sizeof(T) are multiples of 16 bytes).
template <typename T, int D, int LD, int ROWS, typename RowOk>
__device__ __forceinline__ void load_rows(T* __restrict__ dst, const T* __restrict__ src,
                                          int64_t src_stride, RowOk row_ok) {
  constexpr int kVec = Vec16<T>::kElems;
  static_assert(D % kVec == 0, "rows are whole 16-byte vectors");
  constexpr int kVecsPerRow = D / kVec;
  for (int idx = threadIdx.x; idx < ROWS * kVecsPerRow; idx += kThreads) {
    const int r = idx / kVecsPerRow;
    const int v = idx - r * kVecsPerRow;
    Pack16<T> pk;
    pk.raw = make_uint4(0u, 0u, 0u, 0u);
    if (row_ok(r)) pk.raw = __ldg(reinterpret_cast<const uint4*>(src + r * src_stride + v * kVec));
    T* d = dst + r * LD + v * kVec;
    if constexpr ((LD * sizeof(T)) % 16 == 0) {
      *reinterpret_cast<uint4*>(d) = pk.raw;
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) d[e] = pk.elem[e];
    }
  }
}

// Online-softmax step of one warp over its 16 x BLOCK_N scores. Lanes 2r and
// 2r+1 own row r (columns of parity lane & 1) and both keep its running max
// m_i (log2 units) and sum l_i. Writes P (storage type) and alpha[r] =
// exp2(m_old - m_new), the factor the output row must be rescaled by.
template <typename T, int BN, int LDS, int LDP>
__device__ __forceinline__ void softmax_tile(const float* __restrict__ s_w, T* __restrict__ p_w,
                                             const float* __restrict__ key_bias,
                                             float* __restrict__ alpha_w, float scale_log2,
                                             float& m_i, float& l_i, int lane) {
  const int r = lane >> 1;
  const int parity = lane & 1;
  const float* s_row = s_w + r * LDS;
  T* p_row = p_w + r * LDP;
  float tile_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) {
    const int c = parity + 2 * i;
    tile_max = fmaxf(tile_max, fmaf(s_row[c], scale_log2, key_bias[c]));
  }
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  const float m_new = fmaxf(m_i, tile_max);
  // Every key so far masked: keep p = 0 and alpha finite (no -inf - -inf).
  const float m_use = m_new == -INFINITY ? 0.f : m_new;
  const float alpha = exp2f(m_i - m_use);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) {
    const int c = parity + 2 * i;
    const T p = from_float<T>(exp2f(fmaf(s_row[c], scale_log2, key_bias[c]) - m_use));
    p_row[c] = p;
    sum += to_float(p);  // the rounded P that P V uses: numerator and sum agree
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  l_i = l_i * alpha + sum;
  m_i = m_new;
  if (parity == 0) alpha_w[r] = alpha;
}

// Products and output accumulator of one warp: tensor-core and fp32 variants.
template <typename T, int D, bool TENSOR_CORES>
struct WarpTile;

template <typename T, int D>
struct WarpTile<T, D, true> {
  using Cfg = AttnConfig<T, D>;
  static constexpr int BN = Cfg::kBlockN;
  static constexpr int kDFrags = D / 16;
  using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  Acc o[kDFrags];
  Acc row_of;  // row_of.x[i]: the row of element i of any accumulator fragment

  __device__ __forceinline__ void init(float* s_w, int lane) {
#pragma unroll
    for (int f = 0; f < kDFrags; ++f) wmma::fill_fragment(o[f], 0.f);
    for (int idx = lane; idx < 16 * 16; idx += 32)
      s_w[(idx >> 4) * Cfg::kLdS + (idx & 15)] = float(idx >> 4);
    __syncwarp();
    wmma::load_matrix_sync(row_of, s_w, Cfg::kLdS, wmma::mem_row_major);
    __syncwarp();
  }

  // s_w[16 x BN] = q_w[16 x D] k^T
  __device__ __forceinline__ void scores(const T* q_w, const T* k, float* s_w) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
    Acc s[BN / 16];
#pragma unroll
    for (int n = 0; n < BN / 16; ++n) wmma::fill_fragment(s[n], 0.f);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      wmma::load_matrix_sync(a, q_w + kk * 16, Cfg::kLdQ);
#pragma unroll
      for (int n = 0; n < BN / 16; ++n) {
        // k^T as a col-major D x BN matrix: element (d, j) at k[j * LdK + d].
        wmma::load_matrix_sync(b, k + n * 16 * Cfg::kLdK + kk * 16, Cfg::kLdK);
        wmma::mma_sync(s[n], a, b, s[n]);
      }
    }
#pragma unroll
    for (int n = 0; n < BN / 16; ++n)
      wmma::store_matrix_sync(s_w + n * 16, s[n], Cfg::kLdS, wmma::mem_row_major);
  }

  __device__ __forceinline__ void rescale(const float* alpha_w) {
    float scale[Acc::num_elements];
#pragma unroll
    for (int i = 0; i < Acc::num_elements; ++i) scale[i] = alpha_w[static_cast<int>(row_of.x[i])];
#pragma unroll
    for (int f = 0; f < kDFrags; ++f)
#pragma unroll
      for (int i = 0; i < Acc::num_elements; ++i) o[f].x[i] *= scale[i];
  }

  // o += p_w[16 x BN] v[BN x D]
  __device__ __forceinline__ void accumulate(const T* p_w, const T* v) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      wmma::load_matrix_sync(a, p_w + kk * 16, Cfg::kLdP);
#pragma unroll
      for (int f = 0; f < kDFrags; ++f) {
        wmma::load_matrix_sync(b, v + kk * 16 * Cfg::kLdV + f * 16, Cfg::kLdV);
        wmma::mma_sync(o[f], a, b, o[f]);
      }
    }
  }

  // out rows q0_w + r (r < 16, only those < len) = valid ? o[r] * linv[r] : 0,
  // staged through s_w (16 x BN floats) BN / 16 fragments at a time.
  template <typename RowValid>
  __device__ __forceinline__ void store(T* out, int64_t out_stride, int q0_w, int len, float* s_w,
                                        const float* linv_w, RowValid row_valid, int lane) {
    constexpr int kPerPass = BN / 16;
#pragma unroll
    for (int f0 = 0; f0 < kDFrags; f0 += kPerPass) {
#pragma unroll
      for (int f = 0; f < kPerPass; ++f)
        if (f0 + f < kDFrags)
          wmma::store_matrix_sync(s_w + f * 16, o[f0 + f], Cfg::kLdS, wmma::mem_row_major);
      __syncwarp();
      constexpr int kMaxCols = kPerPass * 16;
      const int cols = (kDFrags - f0 < kPerPass ? kDFrags - f0 : kPerPass) * 16;
      for (int idx = lane; idx < 16 * kMaxCols; idx += 32) {
        const int r = idx / kMaxCols;
        const int c = idx - r * kMaxCols;
        const int q = q0_w + r;
        if (c < cols && q < len) {
          const float val = row_valid(q) ? s_w[r * Cfg::kLdS + c] * linv_w[r] : 0.f;
          out[q * out_stride + f0 * 16 + c] = from_float<T>(val);
        }
      }
      __syncwarp();
    }
  }
};

template <typename T, int D>
struct WarpTile<T, D, false> {
  using Cfg = AttnConfig<T, D>;
  static constexpr int BN = Cfg::kBlockN;
  static constexpr int kKeysPerLane = BN / 32;
  static constexpr int kColsPerLane = (D + 31) / 32;
  float o[kWarpRows][kColsPerLane];

  __device__ __forceinline__ void init(float*, int) {
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r)
#pragma unroll
      for (int i = 0; i < kColsPerLane; ++i) o[r][i] = 0.f;
  }

  // s_w[r][lane + 32 kk] = q_w[r] . k[lane + 32 kk]
  __device__ __forceinline__ void scores(const T* q_w, const T* k, float* s_w) {
    const int lane = threadIdx.x & 31;
    float acc[kWarpRows][kKeysPerLane];
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r)
#pragma unroll
      for (int kk = 0; kk < kKeysPerLane; ++kk) acc[r][kk] = 0.f;
#pragma unroll 2
    for (int d = 0; d < D; d += 4) {
      float kv[kKeysPerLane][4];
#pragma unroll
      for (int kk = 0; kk < kKeysPerLane; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) kv[kk][e] = k[(lane + 32 * kk) * Cfg::kLdK + d + e];
#pragma unroll
      for (int r = 0; r < kWarpRows; ++r) {
        const float4 q = *reinterpret_cast<const float4*>(q_w + r * Cfg::kLdQ + d);
#pragma unroll
        for (int kk = 0; kk < kKeysPerLane; ++kk) {
          float a = acc[r][kk];
          a = fmaf(q.x, kv[kk][0], a);
          a = fmaf(q.y, kv[kk][1], a);
          a = fmaf(q.z, kv[kk][2], a);
          a = fmaf(q.w, kv[kk][3], a);
          acc[r][kk] = a;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r)
#pragma unroll
      for (int kk = 0; kk < kKeysPerLane; ++kk) s_w[r * Cfg::kLdS + lane + 32 * kk] = acc[r][kk];
  }

  __device__ __forceinline__ void rescale(const float* alpha_w) {
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      const float a = alpha_w[r];
#pragma unroll
      for (int i = 0; i < kColsPerLane; ++i) o[r][i] *= a;
    }
  }

  // o[r][i] += sum_j p_w[r][j] v[j][lane + 32 i]
  __device__ __forceinline__ void accumulate(const T* p_w, const T* v) {
    const int lane = threadIdx.x & 31;
#pragma unroll 2
    for (int j = 0; j < BN; j += 4) {
      float vv[4][kColsPerLane];
#pragma unroll
      for (int e = 0; e < 4; ++e)
#pragma unroll
        for (int i = 0; i < kColsPerLane; ++i) {
          const int c = lane + 32 * i;
          vv[e][i] = c < D ? v[(j + e) * Cfg::kLdV + c] : 0.f;
        }
#pragma unroll
      for (int r = 0; r < kWarpRows; ++r) {
        const float4 p = *reinterpret_cast<const float4*>(p_w + r * Cfg::kLdP + j);
#pragma unroll
        for (int i = 0; i < kColsPerLane; ++i) {
          float a = o[r][i];
          a = fmaf(p.x, vv[0][i], a);
          a = fmaf(p.y, vv[1][i], a);
          a = fmaf(p.z, vv[2][i], a);
          a = fmaf(p.w, vv[3][i], a);
          o[r][i] = a;
        }
      }
    }
  }

  template <typename RowValid>
  __device__ __forceinline__ void store(T* out, int64_t out_stride, int q0_w, int len, float*,
                                        const float* linv_w, RowValid row_valid, int lane) {
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      const int q = q0_w + r;
      if (q < len) {
        const bool valid = row_valid(q);
        const float inv = linv_w[r];
#pragma unroll
        for (int i = 0; i < kColsPerLane; ++i) {
          const int c = lane + 32 * i;
          if (c < D) out[q * out_stride + c] = from_float<T>(valid ? o[r][i] * inv : 0.f);
        }
      }
    }
  }
};

template <typename T, int D>
__device__ __forceinline__ void attention_cta(const AttnParams& p) {
  using Cfg = AttnConfig<T, D>;
  constexpr int BN = Cfg::kBlockN;
  extern __shared__ __align__(128) unsigned char smem[];
  T* s_q = reinterpret_cast<T*>(smem + Cfg::kQOff);
  T* s_k = reinterpret_cast<T*>(smem + Cfg::kKOff);
  T* s_v = reinterpret_cast<T*>(smem + Cfg::kVOff);
  float* s_s = reinterpret_cast<float*>(smem + Cfg::kSOff);
  T* s_p = reinterpret_cast<T*>(smem + Cfg::kPOff);
  float* s_key_bias = reinterpret_cast<float*>(smem + Cfg::kKeyBiasOff);
  float* s_alpha = reinterpret_cast<float*>(smem + Cfg::kAlphaOff);

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int head = blockIdx.y;
  const int64_t batch_index = blockIdx.z;
  const int q0 = blockIdx.x * kBlockM;

  // This sequence's rows and length.
  int64_t tok0;
  int len;
  const uint8_t* mask = nullptr;
  if (p.cu_seqlens != nullptr) {
    int64_t start = p.cu_seqlens[batch_index];
    int64_t end = p.cu_seqlens[batch_index + 1];
    // Bounds-safe whatever cu_seqlens holds (the op boundary validates it).
    start = start < 0 ? 0 : (start > p.total_tokens ? p.total_tokens : start);
    end = end < start ? start : (end > p.total_tokens ? p.total_tokens : end);
    tok0 = start;
    len = static_cast<int>(end - start > (1LL << 30) ? (1LL << 30) : end - start);
  } else {
    tok0 = batch_index * p.seqlen;
    len = static_cast<int>(p.seqlen);
    if (p.mask != nullptr) mask = p.mask + batch_index * p.seqlen;
  }
  if (q0 >= len) return;  // uniform over the CTA

  const int64_t qkv_stride = 3LL * p.hidden;
  const T* q_base =
      static_cast<const T*>(p.qkv) + tok0 * qkv_stride + static_cast<int64_t>(head) * D;
  const T* k_base = q_base + p.hidden;
  const T* v_base = q_base + 2LL * p.hidden;
  T* out = static_cast<T*>(p.out) + tok0 * p.hidden + static_cast<int64_t>(head) * D;
  auto row_valid = [&](int q) { return q < len && (mask == nullptr || mask[q] != 0); };

  // A tile of padded queries only: zeros, no work.
  const bool my_query = tid < kBlockM && row_valid(q0 + tid);
  if (!__syncthreads_or(my_query)) {
    const int rows = len - q0 < kBlockM ? len - q0 : kBlockM;
    for (int idx = tid; idx < rows * D; idx += kThreads) {
      const int r = idx / D;
      out[static_cast<int64_t>(q0 + r) * p.hidden + (idx - r * D)] = from_float<T>(0.f);
    }
    return;
  }

  load_rows<T, D, Cfg::kLdQ, kBlockM>(s_q, q_base + static_cast<int64_t>(q0) * qkv_stride,
                                      qkv_stride, [&](int r) { return q0 + r < len; });

  const T* q_w = s_q + warp * kWarpRows * Cfg::kLdQ;
  float* s_w = s_s + warp * kWarpRows * Cfg::kLdS;
  T* p_w = s_p + warp * kWarpRows * Cfg::kLdP;
  float* alpha_w = s_alpha + warp * kWarpRows;
  float* linv_w = alpha_w;  // alpha is dead after the last tile

  WarpTile<T, D, Cfg::kTensorCores> tile;
  tile.init(s_w, lane);
  float m_i = -INFINITY;  // running max of row lane / 2, log2 units
  float l_i = 0.f;        // running sum of exp2(s - m_i)

  for (int j0 = 0; j0 < len; j0 += BN) {
    __syncthreads();  // the previous tile's K, V and key bias are consumed (and Q is stored)
    bool key_ok = false;
    if (tid < BN) {
      const int j = j0 + tid;
      key_ok = j < len && (mask == nullptr || mask[j] != 0);
      s_key_bias[tid] = key_ok ? 0.f : -INFINITY;
    }
    if (!__syncthreads_or(key_ok)) continue;  // every key of this tile is masked
    auto key_row_ok = [&](int r) { return s_key_bias[r] == 0.f; };
    load_rows<T, D, Cfg::kLdK, BN>(s_k, k_base + static_cast<int64_t>(j0) * qkv_stride, qkv_stride,
                                   key_row_ok);
    load_rows<T, D, Cfg::kLdV, BN>(s_v, v_base + static_cast<int64_t>(j0) * qkv_stride, qkv_stride,
                                   key_row_ok);
    __syncthreads();

    tile.scores(q_w, s_k, s_w);
    __syncwarp();
    softmax_tile<T, BN, Cfg::kLdS, Cfg::kLdP>(s_w, p_w, s_key_bias, alpha_w, p.scale_log2, m_i, l_i,
                                              lane);
    __syncwarp();
    tile.rescale(alpha_w);
    tile.accumulate(p_w, s_v);
  }

  __syncwarp();  // every lane is done reading alpha_w (aliased by linv_w)
  if ((lane & 1) == 0) linv_w[lane >> 1] = l_i > 0.f ? 1.f / l_i : 0.f;
  __syncwarp();
  tile.store(out, p.hidden, q0 + warp * kWarpRows, len, s_w, linv_w, row_valid, lane);
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) attention_kernel(const AttnParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // bf16 tensor-core fragments need sm_80; builds that add older archs (e.g.
  // BERTFAST_CUDA_ARCHS="75;80;90" for a T4) still compile, and bertfast/ops/cuda.py
  // never launches bf16 attention on such a device.
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    __trap();
  } else {
    attention_cta<T, D>(p);
  }
#else
  attention_cta<T, D>(p);
#endif
}

template <typename T, int D>
cudaError_t attention_typed(const AttnParams& p, int64_t batch, int num_heads,
                            cudaStream_t stream) {
  using Cfg = AttnConfig<T, D>;
  const size_t smem = Cfg::kSmemBytes;
  if (smem > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(attention_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(static_cast<unsigned>((p.seqlen + kBlockM - 1) / kBlockM),
                  static_cast<unsigned>(num_heads), static_cast<unsigned>(batch));
  attention_kernel<T, D><<<grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_attention(void* out, const void* qkv, const uint8_t* mask,
                             const int32_t* cu_seqlens, int64_t batch, int64_t seqlen,
                             int64_t total_tokens, int num_heads, int head_dim, float scale,
                             int dtype, cudaStream_t stream) {
  if (num_heads < 1 || num_heads > kMaxGridYZ || batch < 0 || batch > kMaxGridYZ || seqlen < 0 ||
      seqlen > kMaxCudaSeqLen || total_tokens < 0)
    return cudaErrorInvalidValue;
  // 16-byte vector loads of Q/K/V rows: the base must be 16-byte aligned (row
  // stride 3H and column offsets h*D are multiples of 16 bytes for these D).
  if (!is_aligned16(qkv)) return cudaErrorMisalignedAddress;
  if (batch == 0 || seqlen == 0) return cudaSuccess;
  AttnParams p;
  p.qkv = qkv;
  p.out = out;
  p.mask = cu_seqlens == nullptr ? mask : nullptr;
  p.cu_seqlens = cu_seqlens;
  p.seqlen = seqlen;
  p.total_tokens = total_tokens;
  p.hidden = num_heads * head_dim;
  p.scale_log2 = scale * kLog2e;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Instantiated for exactly the head dims of constants.h; any other is rejected.
    return dispatch_int(CudaAttentionHeadDims{}, head_dim, [&](auto d) {
      return attention_typed<T, decltype(d)::value>(p, batch, num_heads, stream);
    });
  });
}

}  // namespace cuda
}  // namespace bertfast
