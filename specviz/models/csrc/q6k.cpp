// GGUF's Q6_K weights as they are, times float32 activations (AVX2): the Q4_K_M target's other matrices (v and
// down in half its layers, and its head) at 0.83 bytes a weight where int8 reads 1.0, batch-invariant.
//
// Weights (specviz.models.q6k): one 212-byte record per row and block of 256 weights, GGUF's block_q6_K with d
// widened: ql[128] (low 4 bits), qh[64] (high 2 bits), sc[16] (int8 scales, one per 16 weights), d (float32).
// In each half h (128 weights) and lane l (0..31), with A = ql[64h + l], B = ql[64h + 32 + l], H = qh[32h + l]:
//   q(128h + l)      = (A & 15) | (H & 3) << 4        q(128h + 32 + l) = (B & 15) | (H >> 2 & 3) << 4
//   q(128h + 64 + l) = (A >> 4) | (H >> 4 & 3) << 4   q(128h + 96 + l) = (B >> 4) | (H >> 6 & 3) << 4
// and w = d * sc[i / 16] * (q - 32) (llama.cpp's dequantize_row_q6_K).
//
// Activations: each token's blocks of 256 quantized to int8 with one float scale a block (as csrc/q4k.cpp), and
// the sums of each 16 of them.  out[m, n] = sum over blocks b, in order, of 8 float lanes
//   lane l += (dx[m,b] * d[n,b]) * (I_l - 32 J_l)
// where I_l is vpmaddwd's lane l of sc * (q . xq) and J_l of sc . bsum16 (integer, exact), then the lanes summed
// in order: each output computed alone from its own row and token, whatever else is in the pass.
// vpmaddubsw multiplies q (u8, 0..63) by xq (s8): its pair sums (<= 2 x 63 x 127) cannot saturate.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t REC6 = 212;

// the int16 scales of a block s (16 lanes) -> lanes 0-7 scale 2k, lanes 8-15 scale 2k+1
inline __m256i pair_scales(__m256i s, int k) {
  const __m256i both = _mm256_permutevar8x32_epi32(s, _mm256_set1_epi32(k));  // int16 pair (2k, 2k+1) everywhere
  const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                        2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  return _mm256_shuffle_epi8(both, pick);
}

template <int T>
inline void row_tokens(const uint8_t* w, int64_t kb, const int8_t* xq, const float* dx, const int16_t* bs,
                       int64_t ldx, int64_t ldd, int64_t ldb, float* acc) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
  __m256 a[T];
  for (int t = 0; t < T; ++t) a[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* rec = w + b * REC6;
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 192)));
    float d;
    std::memcpy(&d, rec + 208, 4);
    __m256i v[T];
    for (int t = 0; t < T; ++t) {  // -32 J: the scales against the sums of 16
      const __m256i bsum = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs + t * ldb + b * 16));
      v[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(s16, bsum), 5));
    }
    for (int h = 0; h < 2; ++h) {
      const __m256i A = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 64 * h));
      const __m256i B = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 64 * h + 32));
      const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 128 + 32 * h));
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(A, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m2)),
          _mm256_or_si256(_mm256_and_si256(B, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4), _mm256_and_si256(H, m2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), m4), _mm256_and_si256(_mm256_srli_epi16(H, 2), m2))};
      for (int i = 0; i < 4; ++i) {
        const __m256i sc = pair_scales(s16, 4 * h + i);
        for (int t = 0; t < T; ++t) {
          const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + t * ldx + b * 256 + 128 * h + 32 * i));
          v[t] = _mm256_add_epi32(v[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[i], x), sc));
        }
      }
    }
    for (int t = 0; t < T; ++t)
      a[t] = _mm256_add_ps(a[t], _mm256_mul_ps(_mm256_set1_ps(dx[t * ldd + b] * d), _mm256_cvtepi32_ps(v[t])));
  }
  for (int t = 0; t < T; ++t) {
    float la[8];
    _mm256_storeu_ps(la, a[t]);
    float s = la[0];
    for (int l = 1; l < 8; ++l) s = s + la[l];
    acc[t] = s;
  }
}

}  // namespace

// x: float32 [M, K], K a multiple of 256; w: uint8 [N, K/256, 212] (above); bias: float32 [N] or none.
torch::Tensor q6k_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2, "x must be float32 [M, K]");
  TORCH_CHECK(w.dtype() == torch::kUInt8 && w.dim() == 3 && w.size(2) == REC6, "w must be uint8 [N, K/256, 212]");
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
  auto bs = torch::empty({M, kb * 16}, x.options().dtype(torch::kInt16));  // |sum| <= 16 x 127
  const float* xp = x.data_ptr<float>();
  int8_t* qp = xq.data_ptr<int8_t>();
  float* dp = dx.data_ptr<float>();
  int16_t* sp = bs.data_ptr<int16_t>();
  at::parallel_for(0, M * kb, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {  // as csrc/q4k.cpp's, with sums of 16
      const float* xr = xp + i * 256;
      int8_t* qr = qp + i * 256;
      float amax = 0.0f;
      for (int k = 0; k < 256; ++k) amax = std::max(amax, std::fabs(xr[k]));
      const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
      dp[i] = amax / 127.0f;
      for (int j = 0; j < 16; ++j) {
        int32_t s = 0;
        for (int k = 16 * j; k < 16 * j + 16; ++k) {
          const int32_t v = std::max(-127, std::min(127, int32_t(std::nearbyint(xr[k] * id))));
          qr[k] = int8_t(v);
          s += v;
        }
        sp[i * 16 + j] = int16_t(s);
      }
    }
  });
  auto out = torch::empty({M, N}, x.options());
  float* op = out.data_ptr<float>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  at::parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    float acc[3];
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* wr = wp + n * kb * REC6;
      auto emit = [&](int64_t m, int T) {
        for (int t = 0; t < T; ++t) op[(m + t) * N + n] = bp ? acc[t] + bp[n] : acc[t];
      };
      int64_t m = 0;
      for (; m + 3 <= M; m += 3) {
        row_tokens<3>(wr, kb, qp + m * K, dp + m * kb, sp + m * kb * 16, K, kb, kb * 16, acc);
        emit(m, 3);
      }
      for (; m + 2 <= M; m += 2) {
        row_tokens<2>(wr, kb, qp + m * K, dp + m * kb, sp + m * kb * 16, K, kb, kb * 16, acc);
        emit(m, 2);
      }
      for (; m < M; ++m) {
        row_tokens<1>(wr, kb, qp + m * K, dp + m * kb, sp + m * kb * 16, K, kb, kb * 16, acc);
        emit(m, 1);
      }
    }
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(specviz, m) {
  m.def("q6k_linear(Tensor x, Tensor w, Tensor? bias) -> Tensor");
}
TORCH_LIBRARY_IMPL(specviz, CPU, m) {
  m.impl("q6k_linear", &q6k_linear);
}
