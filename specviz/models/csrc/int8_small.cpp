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
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cstdint>

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

void rows4(const uint8_t* x, const int8_t* wb, int64_t M, int64_t kb, int64_t N, int64_t n0, const int32_t* wsum,
           const float* wscale, float act_scale, int32_t zero, float* out) {
  int32_t acc[8];
  const int64_t K = kb * 32;
  int64_t m = 0;
  auto emit = [&](int T) {
    for (int r = 0; r < 4 && n0 + r < N; ++r)
      for (int t = 0; t < T; ++t) {
        const int32_t raw = acc[r * T + t] - zero * wsum[n0 + r];
        out[(m + t) * N + n0 + r] = float(raw) * (act_scale * wscale[n0 + r]);
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
torch::Tensor int8_small(torch::Tensor x, torch::Tensor wb, torch::Tensor wsum, torch::Tensor wscale,
                         double act_scale, int64_t zero) {
  TORCH_CHECK(x.dtype() == torch::kUInt8 && wb.dtype() == torch::kInt8, "x must be uint8 and w int8");
  TORCH_CHECK(wsum.dtype() == torch::kInt32 && wscale.dtype() == torch::kFloat32, "wsum int32, wscale float32");
  TORCH_CHECK(x.dim() == 2 && wb.dim() == 4 && wb.size(2) == 4 && wb.size(3) == 32, "x [M, K], w [N/4, K/32, 4, 32]");
  TORCH_CHECK(x.size(1) == wb.size(1) * 32, "x's K must be w's blocks x 32");
  x = x.contiguous();
  wb = wb.contiguous();
  const int64_t M = x.size(0), kb = wb.size(1), N = wsum.size(0), blocks = wb.size(0);
  TORCH_CHECK(blocks * 4 >= N && wscale.size(0) == N, "w has too few rows");
  auto out = torch::empty({M, N}, x.options().dtype(torch::kFloat32));
  const uint8_t* xp = x.data_ptr<uint8_t>();
  const int8_t* wp = wb.data_ptr<int8_t>();
  const int32_t* sp = wsum.data_ptr<int32_t>();
  const float* cp = wscale.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float a = float(act_scale);
  const int32_t z = int32_t(zero);
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) rows4(xp, wp, M, kb, N, b * 4, sp, cp, a, z, op);
  });
  return out;
}

// An operator (torch.ops.specviz.int8_small), not a Python function, so that torch.jit.trace records it
// (the lean draft's traced steps call it).
TORCH_LIBRARY(specviz, m) {
  m.def("int8_small(Tensor x, Tensor w, Tensor wsum, Tensor wscale, float act_scale, int zero) -> Tensor");
}
TORCH_LIBRARY_IMPL(specviz, CPU, m) { m.impl("int8_small", &int8_small); }
