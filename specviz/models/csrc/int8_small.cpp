// u8 x s8 -> int32 products for few tokens (AVX2), the integer core of specviz's batch-invariant int8 linears.
//
// out[m, n] = (float)(sum_k x[m, k] * w[n, k] - zero * wsum[n]) * (act_scale * wscale[n])   (all float32)
//
// x: uint8 [M, K] (activations quantized with one fixed scale and zero point: values 1..127, seven bits, so
// vpmaddubsw's pairwise int16 sums cannot saturate: 2 x 127 x 128 < 32768); w: the int8 weights [N, K] blocked
// (below; no packing beyond that); wsum: int32 [N] (each row's sum); wscale: float32 [N].  Integer accumulation
// is exact and each output is computed alone from its own row and token, so a token's output is the same bits
// whatever else is in the batch; the float epilogue is fbgemm's (raw * (A_scale * B_scale[n]) in float32), so
// the output is fbgemm's to the bit (checked at load: specviz.models.kernels.matches).
//
// Weights are read once from memory per call: each block of R weight rows stays in L1 while every group of T
// tokens passes over it (4 rows x 2 tokens: 8 accumulators, within AVX2's 16 registers).  Each extra token still
// costs vpmaddubsw + vpmaddwd + an add per 32 multiply-adds: without VNNI a verify pass is compute-bound, as
// fbgemm's is (measured on the AVX2 EPYC: 6 tokens ~2.6x one).
#include "specviz_torch.h"
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>

namespace {

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_hadd_epi32(s, s);
  s = _mm_hadd_epi32(s, s);
  return _mm_cvtsi128_si32(s);
}

// w is blocked: [N/4][K/32][4][32], the 4 rows of a block interleaved 32 bytes at a time, so a block's weights
// are one sequential stream (4 separate row streams ran ~10% slower than fbgemm's packed layout on the EPYC).
template <int T>
inline void block(const uint8_t* x, const int8_t* wb, int64_t kb, int64_t ldx, int32_t* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i a[4][T];
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < T; ++t) a[r][t] = _mm256_setzero_si256();
  for (int64_t k = 0; k < kb; ++k) {
    const int8_t* wk = wb + k * 128;
    _mm_prefetch(reinterpret_cast<const char*>(wk + 8192), _MM_HINT_NTA);
    __m256i xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + t * ldx + k * 32));
    for (int r = 0; r < 4; ++r) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wk + r * 32));
      for (int t = 0; t < T; ++t)
        a[r][t] = _mm256_add_epi32(a[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(xv[t], wv), ones));
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < T; ++t) acc[r * T + t] = hsum(a[r][t]);
}

// rowscale, bias (either may be null): int8_linear's epilogue, the same float operations TokenInt8Linear does
// after the product, in its order -- y * rowscale[m], then + bias[n] -- each rounded on its own (the build
// passes -ffp-contract=off, so the compiler never fuses them into one FMA).
void rows4(const uint8_t* x, const int8_t* wb, int64_t M, int64_t kb, int64_t N, int64_t n0, const int32_t* wsum,
           const float* wscale, float act_scale, int32_t zero, float* out, const float* rowscale = nullptr,
           const float* bias = nullptr) {
  int32_t acc[8];
  const int64_t K = kb * 32;
  int64_t m = 0;
  auto emit = [&](int T) {
    for (int r = 0; r < 4 && n0 + r < N; ++r)
      for (int t = 0; t < T; ++t) {
        const int32_t raw = acc[r * T + t] - zero * wsum[n0 + r];
        float y = float(raw) * (act_scale * wscale[n0 + r]);
        if (rowscale) y = y * rowscale[m + t];
        if (bias) y = y + bias[n0 + r];
        out[(m + t) * N + n0 + r] = y;
      }
  };
  const int8_t* w = wb + (n0 / 4) * kb * 128;
  for (; m + 2 <= M; m += 2) { block<2>(x + m * K, w, kb, K, acc); emit(2); }
  for (; m < M; ++m) { block<1>(x + m * K, w, kb, K, acc); emit(1); }
}

}  // namespace

// x: uint8 [M, K32], K padded to a multiple of 32 (any value: the padded weight columns are 0); wb: int8
// [N4/4, K32/32, 4, 32], N padded to a multiple of 4 (specviz.models.kernels.Weights.of); wsum and wscale: [N],
// the true output count.
sv::Tensor int8_small(sv::Tensor x, sv::Tensor wb, sv::Tensor wsum, sv::Tensor wscale,
                         double act_scale, int64_t zero) {
  SV_CHECK(x.scalar_type() == sv::kUInt8 && wb.scalar_type() == sv::kInt8, "x must be uint8 and w int8");
  SV_CHECK(wsum.scalar_type() == sv::kInt32 && wscale.scalar_type() == sv::kFloat32, "wsum int32, wscale float32");
  SV_CHECK(x.dim() == 2 && wb.dim() == 4 && wb.size(2) == 4 && wb.size(3) == 32, "x [M, K], w [N/4, K/32, 4, 32]");
  SV_CHECK(x.size(1) == wb.size(1) * 32, "x's K must be w's blocks x 32");
  x = sv::contiguous(x);
  wb = sv::contiguous(wb);
  const int64_t M = x.size(0), kb = wb.size(1), N = wsum.size(0), blocks = wb.size(0);
  SV_CHECK(blocks * 4 >= N && wscale.size(0) == N, "w has too few rows");
  auto out = sv::empty({M, N}, sv::options(x).dtype(sv::kFloat32));
  const uint8_t* xp = sv::ptr<uint8_t>(x);
  const int8_t* wp = sv::ptr<int8_t>(wb);
  const int32_t* sp = sv::ptr<int32_t>(wsum);
  const float* cp = sv::ptr<float>(wscale);
  float* op = sv::ptr<float>(out);
  const float a = float(act_scale);
  const int32_t z = int32_t(zero);
  sv::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) rows4(xp, wp, M, kb, N, b * 4, sp, cp, a, z, op);
  });
  return out;
}

// The whole int8 linear of specviz.models.int8_target.TokenInt8Linear in one call, float32 in and out: each
// row's scale s = max(max |x|, 1e-30); its unit row x / s quantized as torch.quantize_per_tensor does (x / s *
// (1 / act_scale) + zero in one fused multiply-add, rounded to nearest even, clamped to 0..255); the u8 x s8 product above; then * s and
// + bias.  The same float operations in the same order as the Python path it replaces (abs, amax, clamp, div,
// quantize, int_repr, pad, int8_small, mul_, add_: ten ops, ~60-90 us a linear on the AVX2 EPYC), so the bits
// are the same (tested against it, and checked at load with the rest of the kernel).
sv::Tensor int8_linear(sv::Tensor x, sv::Tensor wb, sv::Tensor wsum, sv::Tensor wscale,
                          double act_scale, int64_t zero, std::optional<sv::Tensor> bias) {
  SV_CHECK(x.scalar_type() == sv::kFloat32 && x.dim() == 2, "x must be float32 [M, K]");
  SV_CHECK(wb.scalar_type() == sv::kInt8 && wb.dim() == 4 && wb.size(2) == 4 && wb.size(3) == 32,
              "w int8 [N/4, K/32, 4, 32]");
  SV_CHECK(wsum.scalar_type() == sv::kInt32 && wscale.scalar_type() == sv::kFloat32, "wsum int32, wscale float32");
  x = sv::contiguous(x);
  wb = sv::contiguous(wb);
  const int64_t M = x.size(0), K = x.size(1), kb = wb.size(1), K32 = kb * 32, N = wsum.size(0), blocks = wb.size(0);
  SV_CHECK(K <= K32 && K32 - K < 32, "x's K must be w's blocks x 32, less its padding");
  SV_CHECK(blocks * 4 >= N && wscale.size(0) == N, "w has too few rows");
  const float* bp = nullptr;
  sv::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = sv::contiguous(*bias);
    SV_CHECK(b.scalar_type() == sv::kFloat32 && b.numel() == N, "bias must be float32 [N]");
    bp = sv::ptr<float>(b);
  }
  auto q = sv::zeros({M, K32}, sv::options(x).dtype(sv::kUInt8));
  auto s = sv::empty({M}, sv::options(x));
  const float* xp = sv::ptr<float>(x);
  uint8_t* qp = sv::ptr<uint8_t>(q);
  float* sp = sv::ptr<float>(s);
  // as torch.quantize_per_tensor does it (fbgemm's Quantize): one fused multiply-add u * (1 / scale) + zero in
  // float, with 1 / scale taken in float (62.999996 for 1/63), rounded to nearest even; checked against it on
  // 2.2 M values with ties (u * 63 then rounding, or 1/63 inverted exactly, each differed on ~1-2 %)
  const float inv = 1.0f / float(act_scale);
  const float zf = float(zero);
  const int32_t z = int32_t(zero);
  sv::parallel_for(0, M, 8, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float* xr = xp + m * K;
      float mx = 0.0f;
      for (int64_t k = 0; k < K; ++k) mx = std::max(mx, std::fabs(xr[k]));
      mx = std::max(mx, 1e-30f);
      sp[m] = mx;
      uint8_t* qr = qp + m * K32;
      for (int64_t k = 0; k < K; ++k) {
        const float t = std::fma(xr[k] / mx, inv, zf);
        const int32_t v = int32_t(std::nearbyint(t));
        qr[k] = uint8_t(std::min(255, std::max(0, v)));
      }
    }
  });
  auto out = sv::empty({M, N}, sv::options(x));
  const int8_t* wp = sv::ptr<int8_t>(wb);
  const int32_t* wsp = sv::ptr<int32_t>(wsum);
  const float* cp = sv::ptr<float>(wscale);
  float* op = sv::ptr<float>(out);
  const float a = float(act_scale);
  sv::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) rows4(qp, wp, M, kb, N, blk * 4, wsp, cp, a, z, op, sp, bp);
  });
  return out;
}

// The kernel's form of an int8 linear's weights (specviz.models.kernels.Weights.of) in one pass over them: values
// int8 [N, K] -> blocked int8 [N4/4, K32/32, 4, 32] (the layout above, zero-padded) and each row's sum, int32 [N].
// torch took ~3 s for the 1.5B target on the AVX2 EPYC at every start (its int8 -> int32 row sum alone: 2.3 s),
// under the preload's feet; this, ~0.3 s.
std::tuple<sv::Tensor, sv::Tensor> weight_layout(sv::Tensor values) {
  SV_CHECK(values.scalar_type() == sv::kInt8 && values.dim() == 2, "values must be int8 [N, K]");
  values = sv::contiguous(values);
  const int64_t N = values.size(0), K = values.size(1), nb = (N + 3) / 4, kb = (K + 31) / 32;
  auto blocked = sv::empty({nb, kb, 4, 32}, sv::options(values));
  auto wsum = sv::empty({N}, sv::options(values).dtype(sv::kInt32));
  const int8_t* vp = sv::ptr<int8_t>(values);
  int8_t* bp = sv::ptr<int8_t>(blocked);
  int32_t* sp = sv::ptr<int32_t>(wsum);
  sv::parallel_for(0, nb, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int r = 0; r < 4; ++r) {
        const int64_t n = b * 4 + r;
        int8_t* dst = bp + b * kb * 128 + r * 32;
        if (n >= N) {
          for (int64_t k = 0; k < kb; ++k) std::memset(dst + k * 128, 0, 32);
          continue;
        }
        const int8_t* src = vp + n * K;
        int32_t s = 0;
        for (int64_t k = 0; k < K; ++k) s += src[k];
        sp[n] = s;
        for (int64_t k = 0; k < kb; ++k) {
          const int64_t len = std::min<int64_t>(32, K - k * 32);
          std::memcpy(dst + k * 128, src + k * 32, len);
          if (len < 32) std::memset(dst + k * 128 + len, 0, 32 - len);
        }
      }
  });
  return {blocked, wsum};
}

// Operators (torch.ops.specviz.*), not Python functions, so that torch.jit.trace records them (the lean
// steps call them).
STABLE_TORCH_LIBRARY(specviz, m) {
  m.def("int8_small(Tensor x, Tensor w, Tensor wsum, Tensor wscale, float act_scale, int zero) -> Tensor");
  m.def("int8_linear(Tensor x, Tensor w, Tensor wsum, Tensor wscale, float act_scale, int zero, Tensor? bias) -> Tensor");
  m.def("weight_layout(Tensor values) -> (Tensor, Tensor)");
}
STABLE_TORCH_LIBRARY_IMPL(specviz, CPU, m) {
  m.impl("int8_small", TORCH_BOX(&int8_small));
  m.impl("int8_linear", TORCH_BOX(&int8_linear));
  m.impl("weight_layout", TORCH_BOX(&weight_layout));
}
