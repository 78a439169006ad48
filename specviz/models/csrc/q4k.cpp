// GGUF's Q4_K weights as they are, times float32 activations (AVX2): the target's linears at 0.59 bytes a weight
// where int8 reads 1.0, batch-invariant.
//
// Weights (specviz.models.q4k.Q4KWeights): one 152-byte record per row and block of 256 weights,
//   qs[128]   GGUF's nibbles unchanged: chunk c (64 weights) = 32 bytes, low nibbles its weights 0..31,
//             high nibbles 32..63
//   sc[8]     the 6-bit scales of the block's eight sub-blocks of 32, unpacked from GGUF's 12 bytes
//   mn[8]     the 6-bit mins, likewise
//   d, dmin   float32 (GGUF's fp16, widened)
// so that w = d * sc[j] * q - dmin * mn[j] for a weight q (0..15) of sub-block j: llama.cpp's dequantization.
//
// Activations: each token's 256-value blocks quantized to int8 with one float scale a block (llama.cpp's Q8_K
// idea): dx = amax / 127, xq = round-to-nearest-even(x * (127 / amax)), and the eight sub-block sums of xq.
//
// out[m, n] = A - B (+ bias[n]), in float32, each operation rounded on its own (-ffp-contract=off), where over the
// blocks b in order, per lane:
//   A: 8 lanes, lane l += (dx[m,b] * d[n,b]) * I_l,  I_l = sum_j sc[j] * sum of q_i xq_i over i = 32 j + 4 l .. + 3
//   B: 4 lanes, lane l += (dx[m,b] * dmin[n,b]) * (mn[2l] bsum[2l] + mn[2l+1] bsum[2l+1])   (bsum: xq's sums of 32)
// (the lanes vpmaddwd and _mm_madd_epi16 leave; integer sums exact), then A = ((a_0 + a_1) + a_2) + ... + a_7 and
// B likewise over its 4 lanes.  No horizontal sum per block: ~1.6x the throughput of one.  Every output is computed alone from its own row and
// token in that order, so a token's output is the same bits whatever else is in the pass (a verify pass, a step).
// vpmaddubsw multiplies q (u8, 0..15) by xq (s8): its pair sums (<= 2 x 15 x 127) cannot saturate.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t REC = 152;  // bytes of one row's block of 256 weights
// No software prefetch: on the Zen 3 EPYC the hardware's did best (one token, 16 MB from memory: 1.02-1.17 ms
// without, 1.18-1.51 ms prefetching 1.2-8 KB ahead, T0 or NTA, interleaved runs).

// vpshufb masks broadcasting int16 lane j (of each 128-bit half) to every lane
alignas(32) const int8_t PICK[8][32] = {
#define SPECVIZ_PICK(j) {2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, \
                          2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1}
    SPECVIZ_PICK(0), SPECVIZ_PICK(1), SPECVIZ_PICK(2), SPECVIZ_PICK(3),
    SPECVIZ_PICK(4), SPECVIZ_PICK(5), SPECVIZ_PICK(6), SPECVIZ_PICK(7)};
#undef SPECVIZ_PICK

inline __m256i pick(int j) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(PICK[j])); }

// R rows (each kb * REC bytes after the last) against T tokens (xq [T][K], dx [T][KB], bs int16 [T][KB*8], each
// token ld* apart), all K blocks; acc[r * T + t].  Each (row, token) goes through the same operations whatever R
// and T are: R and T only decide what is loaded once and shared.
template <int R, int T>
inline void rows_tokens(const uint8_t* w, int64_t kb, const int8_t* xq, const float* dx, const int16_t* bs,
                        int64_t ldx, int64_t ldd, int64_t ldb, float* acc) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256 a[R][T];   // per-lane sums of dx * d * (the lane's integer sum), lanes as vpmaddwd leaves them
  __m128 am[R][T];  // per-lane sums of dx * dmin * (mn . bsum), lanes as _mm_madd_epi16 leaves them
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      a[r][t] = _mm256_setzero_ps();
      am[r][t] = _mm_setzero_ps();
    }
  const int64_t row_bytes = kb * REC;
  for (int64_t b = 0; b < kb; ++b) {
    __m256i v[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) v[r][t] = _mm256_setzero_si256();
    __m256i sc[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* rec = w + r * row_bytes + b * REC;
      sc[r] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + 128))));
    }
    for (int c = 0; c < 4; ++c) {
      __m256i xl[T], xh[T];
      for (int t = 0; t < T; ++t) {
        const int8_t* x = xq + t * ldx + b * 256 + 64 * c;
        xl[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
        xh[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32));
      }
      for (int r = 0; r < R; ++r) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * row_bytes + b * REC + 32 * c));
        const __m256i lo = _mm256_and_si256(q, low);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
        const __m256i s0 = _mm256_shuffle_epi8(sc[r], pick(2 * c));
        const __m256i s1 = _mm256_shuffle_epi8(sc[r], pick(2 * c + 1));
        for (int t = 0; t < T; ++t) {
          v[r][t] = _mm256_add_epi32(v[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl[t]), s0));
          v[r][t] = _mm256_add_epi32(v[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh[t]), s1));
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const uint8_t* rec = w + r * row_bytes + b * REC;
      const __m128i mn = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + 136)));
      float d, dmin;
      std::memcpy(&d, rec + 144, 4);
      std::memcpy(&dmin, rec + 148, 4);
      for (int t = 0; t < T; ++t) {
        const float xd = dx[t * ldd + b];
        const __m128i bsum = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bs + t * ldb + b * 8));
        const __m128i m4 = _mm_madd_epi16(mn, bsum);  // lane i: mn[2i] bsum[2i] + mn[2i+1] bsum[2i+1] (exact)
        a[r][t] = _mm256_add_ps(a[r][t], _mm256_mul_ps(_mm256_set1_ps(xd * d), _mm256_cvtepi32_ps(v[r][t])));
        am[r][t] = _mm_add_ps(am[r][t], _mm_mul_ps(_mm_set1_ps(xd * dmin), _mm_cvtepi32_ps(m4)));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {  // the lanes summed in order: ((l0 + l1) + l2) + ...
      float la[8], lm[4];
      _mm256_storeu_ps(la, a[r][t]);
      _mm_storeu_ps(lm, am[r][t]);
      float sa = la[0], sm = lm[0];
      for (int l = 1; l < 8; ++l) sa = sa + la[l];
      for (int l = 1; l < 4; ++l) sm = sm + lm[l];
      acc[r * T + t] = sa - sm;
    }
}

}  // namespace

// x: float32 [M, K], K a multiple of 256; w: uint8 [N, K/256, 152] (above); bias: float32 [N] or none.
torch::Tensor q4k_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2, "x must be float32 [M, K]");
  TORCH_CHECK(w.dtype() == torch::kUInt8 && w.dim() == 3 && w.size(2) == REC, "w must be uint8 [N, K/256, 152]");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0), kb = w.size(1);
  TORCH_CHECK(K == kb * 256, "x's K must be w's blocks x 256");
  const float* bp = nullptr;
  torch::Tensor bt;
  if (bias.has_value() && bias->defined()) {
    bt = bias->contiguous();
    TORCH_CHECK(bt.dtype() == torch::kFloat32 && bt.numel() == N, "bias must be float32 [N]");
    bp = bt.data_ptr<float>();
  }
  auto xq = torch::empty({M, K}, x.options().dtype(torch::kInt8));
  auto dx = torch::empty({M, kb}, x.options());
  auto bs = torch::empty({M, kb * 8}, x.options().dtype(torch::kInt16));  // |sum| <= 32 x 127
  const float* xp = x.data_ptr<float>();
  int8_t* qp = xq.data_ptr<int8_t>();
  float* dp = dx.data_ptr<float>();
  int16_t* sp = bs.data_ptr<int16_t>();
  at::parallel_for(0, M * kb, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float* xr = xp + i * 256;  // token i / kb, block i % kb: rows are contiguous, K = kb * 256
      int8_t* qr = qp + i * 256;
      float amax = 0.0f;
      for (int k = 0; k < 256; ++k) amax = std::max(amax, std::fabs(xr[k]));
      const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
      dp[i] = amax / 127.0f;
      for (int j = 0; j < 8; ++j) {
        int32_t s = 0;
        for (int k = 32 * j; k < 32 * j + 32; ++k) {
          const float t = xr[k] * id;
          const int32_t v = std::max(-127, std::min(127, int32_t(std::nearbyint(t))));
          qr[k] = int8_t(v);
          s += v;
        }
        sp[i * 8 + j] = int16_t(s);
      }
    }
  });
  auto out = torch::empty({M, N}, x.options());
  float* op = out.data_ptr<float>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  // Each row against three tokens at a time (measured on the Zen 3 EPYC: ~1.3x the per-token rate of one at a
  // time; four spill registers), then two, then one.  (Four rows at a time for one token, sharing its loads, ran
  // 2-3x slower with the weights coming from memory there: rows_tokens keeps R for such trials.)
  at::parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    float acc[3];
    for (int64_t n = n0; n < n1; ++n) {
      auto emit = [&](int64_t m, int T) {
        for (int t = 0; t < T; ++t) op[(m + t) * N + n] = bp ? acc[t] + bp[n] : acc[t];
      };
      const uint8_t* wr = wp + n * kb * REC;
      int64_t m = 0;
      for (; m + 3 <= M; m += 3) {
        rows_tokens<1, 3>(wr, kb, qp + m * K, dp + m * kb, sp + m * kb * 8, K, kb, kb * 8, acc);
        emit(m, 3);
      }
      for (; m + 2 <= M; m += 2) {
        rows_tokens<1, 2>(wr, kb, qp + m * K, dp + m * kb, sp + m * kb * 8, K, kb, kb * 8, acc);
        emit(m, 2);
      }
      for (; m < M; ++m) {
        rows_tokens<1, 1>(wr, kb, qp + m * K, dp + m * kb, sp + m * kb * 8, K, kb, kb * 8, acc);
        emit(m, 1);
      }
    }
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(specviz, m) {
  m.def("q4k_linear(Tensor x, Tensor w, Tensor? bias) -> Tensor");
}
TORCH_LIBRARY_IMPL(specviz, CPU, m) {
  m.impl("q4k_linear", &q4k_linear);
}
