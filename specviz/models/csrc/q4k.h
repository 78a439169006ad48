// What specviz's GGUF kernels share (csrc/q4k.cpp: Q4_K records, csrc/q6k.cpp: Q6_K ones): the prefetch, the in-order
// lane sum every kernel ends with (its bits), the activations' quantization to int8 blocks of 256 (llama.cpp's Q8_K
// idea) and the driver that runs a kernel over every row four tokens at a time.  Compiled with -ffp-contract=off.
#pragma once
#include "specviz_torch.h"
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>

#define SPECVIZ_VNNI __attribute__((target("avx512vnni,avx512vl,avx512bw,avx512f,avx2,fma")))
#define SPECVIZ_VNNI_Z __attribute__((target("avx512vnni,avx512vl,avx512bw,avx512dq,avx512f,avx2,fma")))

namespace specviz_gguf {

// Software prefetch PF bytes ahead in the row stream (a Q4_K record's bytes 0 and 128, a Q6_K one's 0, 96, 192): on the Zen 3
// EPYC, the models' eager steps in one process, with and without it interleaved, 12 reps, medians: the target's
// step 95.4 -> 84.2 ms (records in huge pages, models.hugepages), its pass over 4 tokens 153.9 -> 148.0, the
// draft's step 39.0 -> 34.7 (4 KiB pages).  (With the earlier kernel and 4 KiB pages it had measured slower.)
constexpr int64_t PF = 2048;
inline void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }

// A register's float lanes summed in order, ((l0 + l1) + l2) + ...: every kernel's last step (its bits).
inline float in_order(__m256 v) {
  float l[8];
  _mm256_storeu_ps(l, v);
  float s = l[0];
  for (int i = 1; i < 8; ++i) s = s + l[i];
  return s;
}
// Eight registers' in-order lane sums at once, each lane out[i] = ((v[i]_0 + v[i]_1) + v[i]_2) + ... + v[i]_7: the
// 8 x 8 transpose, then seven vector sums (in_order's bits, every output: one float sum at a time, in order).
inline __m256 in_order8(const __m256 v[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[4], 0x20), _mm256_permute2f128_ps(u[1], u[5], 0x20));
  s = _mm256_add_ps(s, _mm256_permute2f128_ps(u[2], u[6], 0x20));
  s = _mm256_add_ps(s, _mm256_permute2f128_ps(u[3], u[7], 0x20));
  for (int i = 0; i < 4; ++i) s = _mm256_add_ps(s, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  return s;
}

// in_order8's sums put back in output order, as pair_sums lays them out (v[t] output 2t, v[4 + t] output 2t + 1):
// lane i < 4 is output 2i's, lane 4 + i output 2i + 1's.
inline void put8(__m256 s, float* out) {
  alignas(32) float l[8];
  _mm256_store_ps(l, s);
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = l[i];
    out[2 * i + 1] = l[4 + i];
  }
}

// A token pair kernel's lane sums for one row: P registers of two outputs each (output 2t in a[t]'s low eight
// lanes, 2t + 1 in its high eight), each output's lanes summed in order into out[0 .. 2P - 1] -- eight outputs at
// once from three pairs on (unused: zeros), one at a time below that (there the transposes cost more).
template <int P>
SPECVIZ_VNNI_Z inline void pair_sums(const __m512 a[P], float* out) {
  if constexpr (P < 3) {
    for (int t = 0; t < P; ++t) {
      out[2 * t] = in_order(_mm512_castps512_ps256(a[t]));
      out[2 * t + 1] = in_order(_mm512_extractf32x8_ps(a[t], 1));
    }
  } else {
    __m256 v[8];
    for (int t = 0; t < 4; ++t) {
      v[t] = t < P ? _mm512_castps512_ps256(a[t % P]) : _mm256_setzero_ps();
      v[4 + t] = t < P ? _mm512_extractf32x8_ps(a[t % P], 1) : _mm256_setzero_ps();
    }
    put8(in_order8(v), out);
  }
}


// One block as defined above, value by value: a block whose real inputs are not a whole number of eights takes it.
// (Both paths give q4k.reference's / q6k.reference's bits: the tests' torch oracles.)
template <int G>
inline void quantize_block_scalar(const float* xr, int n, int8_t* qr, float* dp, int16_t* sp) {
  float amax = 0.0f;
  for (int k = 0; k < n; ++k) amax = std::max(amax, std::fabs(xr[k]));
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  *dp = amax / 127.0f;
  for (int j = 0; j < 256 / G; ++j) {
    int32_t s = 0;
    for (int k = G * j; k < G * j + G; ++k) {
      const float t = k < n ? xr[k] * id : 0.0f;
      const int32_t v = std::max(-127, std::min(127, int32_t(std::nearbyint(t))));
      constexpr int P = G / 8;  // values of a sub-block side by side in a group: 4 (Q4_K), 2 (Q6_K)
      const int i = k - G * j;
      qr[32 * (i / P) + P * j + i % P] = int8_t(v);
      s += v;
    }
    sp[j] = int16_t(s);
  }
}

// The same in AVX2, eight values at a time (~15x faster: a product's activations were ~1.5 ms of the target's step).
// The same bits: |x| and the max as above (a NaN ignored alike), x * id rounded to nearest even by vcvtps2dq (as
// nearbyint in the default rounding mode), the same clamp; then the values go to their places word by word (a
// sub-block's four or two side by side: an 8 x 8 transpose of 32-bit words, or 16 x 8 of 16-bit ones).
template <int G>
inline void quantize_block(const float* xr, int n, int8_t* qr, float* dp, int16_t* sp) {
  if (n % 8 != 0) return quantize_block_scalar<G>(xr, n, qr, dp, sp);
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 mx = _mm256_setzero_ps();
  for (int k = 0; k < n; k += 8) mx = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xr + k), magnitude), mx);
  float lanes[8];
  _mm256_storeu_ps(lanes, mx);
  float amax = 0.0f;
  for (int l = 0; l < 8; ++l) amax = std::max(amax, lanes[l]);
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  *dp = amax / 127.0f;
  const __m256 idv = _mm256_set1_ps(id);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  alignas(32) int8_t nat[256];  // the values in weight order
  auto sum = [](__m256i v) {  // the eight lanes' integer sum (exact)
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
    int32_t s = 0;
    for (int l = 0; l < 8; ++l) s += lanes[l];
    return int16_t(s);
  };
  for (int c = 0; c < 256; c += 32) {
    __m256i v[4];
    for (int u = 0; u < 4; ++u) {
      const int k = c + 8 * u;
      const __m256 t = k < n ? _mm256_mul_ps(_mm256_loadu_ps(xr + k), idv) : _mm256_setzero_ps();
      v[u] = _mm256_min_epi32(hi, _mm256_max_epi32(lo, _mm256_cvtps_epi32(t)));
    }
    if (G == 32) {  // one sub-block of 32
      sp[c / 32] = sum(_mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3])));
    } else {  // two of 16
      sp[c / 16] = sum(_mm256_add_epi32(v[0], v[1]));
      sp[c / 16 + 1] = sum(_mm256_add_epi32(v[2], v[3]));
    }
    // packs work within 128-bit lanes: 32-bit words v0[0..3] v1[0..3] v2[0..3] v3[0..3] | v0[4..7] ..; reordered
    const __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_store_si256(reinterpret_cast<__m256i*>(nat + c), _mm256_permutevar8x32_epi32(p8, order));
  }
  if (G == 32) {  // sub-block j's word w (values 4w .. 4w + 3) to word 8 w + j
    uint32_t in[64], out[64];
    std::memcpy(in, nat, 256);
    for (int j = 0; j < 8; ++j)
      for (int w = 0; w < 8; ++w) out[8 * w + j] = in[8 * j + w];
    std::memcpy(qr, out, 256);
  } else {  // sub-block j's word w (values 2w, 2w + 1) to word 16 w + j
    uint16_t in[128], out[128];
    std::memcpy(in, nat, 256);
    for (int j = 0; j < 16; ++j)
      for (int w = 0; w < 8; ++w) out[16 * w + j] = in[8 * j + w];
    std::memcpy(qr, out, 256);
  }
}

// Each token's blocks of 256 (n_blocks of them, rows contiguous) quantized to int8 with one float scale a block
// (llama.cpp's Q8_K idea): dx = amax / 127, xq = round-to-nearest-even(x * (127 / amax)), and the sums of each G
// (the weights' sub-blocks), each value stored where the weights keep theirs: value 32 s + j of a Q4_K block
// (G = 32) at 32 (j / 4) + 4 s + j % 4, value 16 s + j of a Q6_K one (G = 16) at 32 (j / 2) + 2 s + j % 2.
// x's rows are K_in long (the last block's inputs past K_in count as zeros: a K short of a whole block, the
// draft's 896, needs no padded copy); token i / kb, block i % kb.  A one-token step's (up to 64 blocks, ~5 us)
// in this thread: splitting it cost more than it saved.
template <int G>
void quantize_blocks(const float* xp, int64_t n_blocks, int64_t kb, int64_t K_in, int8_t* qp, float* dp, int16_t* sp) {
  sv::parallel_for(0, n_blocks, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float* xr = xp + (i / kb) * K_in + (i % kb) * 256;
      const int n = int(std::min<int64_t>(256, K_in - (i % kb) * 256));  // the block's real inputs
      quantize_block<G>(xr, n, qp + i * 256, dp + i, sp + i * (256 / G));
    }
  });
}

// A product's checked inputs and its activations, quantized once (sums of G): what a driver runs its kernel on.
// Q4_K's kernels also read y = dx * bsum, float [M, kb * 8] (each sum of 32 times its block's scale, one rounding):
// the mins' factor, made once a call rather than once a row.
struct Activations {
  sv::Tensor w, bt, xq, dx, bs, y;  // records (contiguous); bias; int8 [M, K]; float [M, kb]; int16 [M, kb * 256 / G];
                                    // float [M, kb * 8] (Q4_K)
  const float* bias;  // or nullptr
  int64_t M, K, kb, N;
};

// x: float32 [M, K], K within w's last block of 256 (zero-padded to it); w: uint8 [N, ceil(K/256), rec]; bias: float32 [N] or none.
template <int G>
Activations activations(sv::Tensor x, sv::Tensor w, std::optional<sv::Tensor> bias, int64_t rec) {
  SV_CHECK(x.scalar_type() == sv::kFloat32 && x.dim() == 2, "x must be float32 [M, K]");
  SV_CHECK(w.scalar_type() == sv::kUInt8 && w.dim() == 3 && w.size(2) == rec, "w must be uint8 [N, K/256, ", rec, "]");
  Activations a;
  a.w = sv::contiguous(w);
  a.kb = a.w.size(1);
  // a K short of a whole block (the draft's 896): the records' last block zero past K, x's missing inputs read as zeros
  SV_CHECK(x.size(1) <= a.kb * 256 && x.size(1) > a.kb * 256 - 256, "x's K must fill w's blocks of 256 but the last");
  x = sv::contiguous(x);
  a.M = x.size(0);
  a.K = a.kb * 256;
  a.N = a.w.size(0);
  a.bias = nullptr;
  if (bias.has_value() && bias->defined()) {
    a.bt = sv::contiguous(*bias);
    SV_CHECK(a.bt.scalar_type() == sv::kFloat32 && a.bt.numel() == a.N, "bias must be float32 [N]");
    a.bias = sv::ptr<float>(a.bt);
  }
  a.xq = sv::empty({a.M, a.K}, sv::options(x).dtype(sv::kInt8));
  a.dx = sv::empty({a.M, a.kb}, sv::options(x));
  a.bs = sv::empty({a.M, a.kb * (256 / G)}, sv::options(x).dtype(sv::kInt16));  // |sum| <= G x 127
  quantize_blocks<G>(sv::ptr<float>(x), a.M * a.kb, a.kb, x.size(1), sv::ptr<int8_t>(a.xq), sv::ptr<float>(a.dx),
                     sv::ptr<int16_t>(a.bs));
  if (G == 32) {
    a.y = sv::empty({a.M, a.kb * 8}, sv::options(x));
    const float* dp = sv::ptr<float>(a.dx);
    const int16_t* sp = sv::ptr<int16_t>(a.bs);
    float* yp = sv::ptr<float>(a.y);
    for (int64_t i = 0; i < a.M * a.kb * 8; ++i) yp[i] = dp[i / 8] * float(sp[i]);
  }
  return a;
}

// The activations (above), then each row against four tokens at a time, then three, two, one:
// kernel(std::integral_constant<int, T>, row, kb, xq, dx, sums, ldx, ldd, ldb, acc) gives a row's T outputs.  (Zen 3
// EPYC: with the scales applied once a block, four fit AVX2's 16 registers; a verify of 4 or 7 tokens ran ~15-20 %
// faster than as 3 + 1 or 3 + 3 + 1.  Q6_K's VNNI kernel keeps four too: eight measured 0.94-1.02x on the head's
// rows, memory-bound, on the AMX Xeon.  Four rows at a time for one token, sharing its loads, ran 2-3x slower with the
// weights coming from memory on the Zen 3.)
template <int G, class Kernel>
sv::Tensor blocked_linear(sv::Tensor x, sv::Tensor w, std::optional<sv::Tensor> bias, int64_t rec,
                             Kernel kernel) {
  const Activations a = activations<G>(x, w, bias, rec);
  const int64_t M = a.M, K = a.K, kb = a.kb, N = a.N, S = 256 / G;
  const int8_t* qp = sv::ptr<int8_t>(a.xq);
  const float* dp = sv::ptr<float>(a.dx);
  const int16_t* sp = sv::ptr<int16_t>(a.bs);
  const float* yp = G == 32 ? sv::ptr<float>(a.y) : nullptr;
  const float* bp = a.bias;
  auto out = sv::empty({M, N}, sv::options(x));
  float* op = sv::ptr<float>(out);
  const uint8_t* wp = sv::ptr<uint8_t>(a.w);
  sv::parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    float acc[4];
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* wr = wp + n * kb * rec;
      auto run = [&](int64_t m, auto t) {
        kernel(t, wr, kb, qp + m * K, dp + m * kb, sp + m * kb * S, yp ? yp + m * kb * 8 : nullptr, K, kb, kb * S, acc);
        for (int i = 0; i < decltype(t)::value; ++i) op[(m + i) * N + n] = bp ? acc[i] + bp[n] : acc[i];
      };
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) run(m, std::integral_constant<int, 4>{});
      for (; m + 3 <= M; m += 3) run(m, std::integral_constant<int, 3>{});
      for (; m + 2 <= M; m += 2) run(m, std::integral_constant<int, 2>{});
      for (; m < M; ++m) run(m, std::integral_constant<int, 1>{});
    }
  });
  return out;
}

// ---- Two tokens a 512-bit register (the VNNI kernels' multi-token passes) ----
// Tokens 2p and 2p + 1 of a pass share a zmm, token 2p in its low eight int32 / float lanes and 2p + 1 in its high
// eight, so each vpdpbusd, conversion, product and sum does two tokens' work, every lane through the operations the
// one-token kernel gives it (the same bits: tests/test_q4k.py, every pass length 1-19 against the oracle and against
// each token alone).  A row's weights go to both halves by a broadcast load; the activations are laid out for it
// once a call: each 32-byte group of token 2p, then 2p + 1's; dx spread over the 16 lanes it scales; the two tokens'
// sums of G side by side, and (Q4_K) their y.
struct Pairs {  // the activations of P = M / 2 token pairs, as a pairs kernel reads them
  sv::Tensor xz, dz, yz, bz;  // int8 [P, 2K]; float [P, kb, 16]; float [P, kb, 16] (Q4_K's y); int16 [P, kb, 2 * 256 / G]
};

template <int G>
Pairs pair_layout(const int8_t* xq, const float* dx, const int16_t* bs, const float* y, int64_t M, int64_t K,
                  int64_t kb, const sv::Options& opt) {
  constexpr int S = 256 / G;
  const int64_t P = M / 2;
  Pairs out{sv::empty({P, 2 * K}, opt.dtype(sv::kInt8)), sv::empty({P, kb * 16}, opt.dtype(sv::kFloat32)),
            sv::empty({G == 32 ? P : 0, kb * 16}, opt.dtype(sv::kFloat32)),
            sv::empty({P, kb * 2 * S}, opt.dtype(sv::kInt16))};
  int8_t* xz = sv::ptr<int8_t>(out.xz);
  float *dz = sv::ptr<float>(out.dz), *yz = G == 32 ? sv::ptr<float>(out.yz) : nullptr;
  int16_t* bz = sv::ptr<int16_t>(out.bz);
  for (int64_t p = 0; p < P; ++p)
    for (int h = 0; h < 2; ++h) {
      const int64_t t = 2 * p + h;
      for (int64_t g = 0; g < K / 32; ++g) std::memcpy(xz + p * 2 * K + 64 * g + 32 * h, xq + t * K + 32 * g, 32);
      for (int64_t b = 0; b < kb; ++b) {
        std::fill_n(dz + (p * kb + b) * 16 + 8 * h, 8, dx[t * kb + b]);
        if (G == 32) std::memcpy(yz + (p * kb + b) * 16 + 8 * h, y + (t * kb + b) * 8, 32);
        std::memcpy(bz + (p * kb + b) * 2 * S + S * h, bs + (t * kb + b) * S, 2 * S);
      }
    }
  return out;
}

// The driver of a pairs kernel: rows two at a time where a pass's activations outgrow L1 (they then share each
// activation load: the down product's 8 tokens x 8,960 inputs, 72 KB, one row at a time read from L2 once a row),
// against four token pairs a pass (MAXP2 with two rows), the rest (pairs and an odd token) in one more.  kernel(rows, pairs, odd, row, kb, xz, dz, yz, bz, x1, d1,
// b1, y1, acc) (the first three std::integral_constant) gives row r's outputs at acc[9 r ..]: pair p's at 2p, 2p + 1,
// the odd token's (x1, d1, b1, y1: its xq, dx, sums and y as the one-token kernel reads them) at 2 pairs.
template <int G, int MAXP2 = 4, class Kernel>
sv::Tensor paired_linear(sv::Tensor x, sv::Tensor w, std::optional<sv::Tensor> bias, int64_t rec, Kernel kernel) {
  constexpr int S = 256 / G;
  const Activations act = activations<G>(x, w, bias, rec);
  const int64_t M = act.M, K = act.K, kb = act.kb, N = act.N, P = M / 2;
  const int8_t* qp = sv::ptr<int8_t>(act.xq);
  const float* dp = sv::ptr<float>(act.dx);
  const int16_t* sp = sv::ptr<int16_t>(act.bs);
  const float* yp = G == 32 ? sv::ptr<float>(act.y) : nullptr;
  const Pairs pr = pair_layout<G>(qp, dp, sp, yp, M, K, kb, sv::options(x));
  const int8_t* xz = sv::ptr<int8_t>(pr.xz);
  const float *dz = sv::ptr<float>(pr.dz), *yz = G == 32 ? sv::ptr<float>(pr.yz) : nullptr;
  const int16_t* bz = sv::ptr<int16_t>(pr.bz);
  const int8_t* x1 = qp + (M - 1) * K;  // the odd token's, where M is odd
  const float* d1 = dp + (M - 1) * kb;
  const int16_t* b1 = sp + (M - 1) * kb * S;
  const float* y1 = yp ? yp + (M - 1) * kb * 8 : nullptr;
  auto out = sv::empty({M, N}, sv::options(x));
  float* op = sv::ptr<float>(out);
  const float* bp = act.bias;
  const uint8_t* wp = sv::ptr<uint8_t>(act.w);
  const bool odd = M % 2;
  // two rows a pass only where the pass's activations outgrow L1 (32 KB).  Zen 5 EPYC, weights from memory, 2 threads:
  // the target's down (K 8,960) at 8 tokens 0.91 -> 0.62 ms; its gate/up (K 1,536) slower with two rows (0.36 -> 0.95
  // ms at 2 tokens, 0.66 -> 1.11 at 8) though faster with its weights in cache (L3: 252 -> 233 us at 8, one thread)
  const bool onerow = M * K <= 32768;
  sv::parallel_for(0, (N + 1) / 2, 4, [&](int64_t h0, int64_t h1) {
    float acc[18];
    for (int64_t n = 2 * h0, rows = 0; n < std::min(N, 2 * h1); n += rows) {
      const uint8_t* wr = wp + n * kb * rec;
      rows = (n + 1 < std::min(N, 2 * h1) && !onerow) ? 2 : 1;
      int64_t p = 0;
      auto run = [&](auto pairs, auto with_odd) {
        constexpr int C = decltype(pairs)::value;
        constexpr bool O = decltype(with_odd)::value;
        const auto args = std::make_tuple(wr, kb, xz + p * 2 * K, dz + p * kb * 16, yz ? yz + p * kb * 16 : nullptr,
                                          bz + p * kb * 2 * S, x1, d1, b1, y1, acc);
        if (rows == 2)
          std::apply([&](auto... a) { kernel(std::integral_constant<int, 2>{}, pairs, with_odd, a...); }, args);
        else
          std::apply([&](auto... a) { kernel(std::integral_constant<int, 1>{}, pairs, with_odd, a...); }, args);
        for (int r = 0; r < rows; ++r) {
          const float bn = bp ? bp[n + r] : 0.0f;
          for (int i = 0; i < 2 * C; ++i) op[(2 * p + i) * N + n + r] = bp ? acc[9 * r + i] + bn : acc[9 * r + i];
          if (O) op[(M - 1) * N + n + r] = bp ? acc[9 * r + 2 * C] + bn : acc[9 * r + 2 * C];
        }
        p += C;
      };
      using No = std::false_type;
      using Yes = std::true_type;
      auto sweep = [&](auto most) {  // the pairs, at most `most` a pass, then the rest and the odd token in one more
        constexpr int X = decltype(most)::value;
        while (P - p > X || (P - p == X && !odd)) run(std::integral_constant<int, X>{}, No{});
        switch (2 * (P - p) + odd) {
          case 9: if constexpr (X >= 4) run(std::integral_constant<int, 4>{}, Yes{}); break;
          case 7: if constexpr (X >= 3) run(std::integral_constant<int, 3>{}, Yes{}); break;
          case 6: if constexpr (X >= 3) run(std::integral_constant<int, 3>{}, No{}); break;
          case 5: run(std::integral_constant<int, 2>{}, Yes{}); break;
          case 4: run(std::integral_constant<int, 2>{}, No{}); break;
          case 3: run(std::integral_constant<int, 1>{}, Yes{}); break;
          case 2: run(std::integral_constant<int, 1>{}, No{}); break;
          default: break;
        }
      };
      if (rows == 2)
        sweep(std::integral_constant<int, MAXP2>{});
      else
        sweep(std::integral_constant<int, 4>{});
    }
  });
  return out;
}

// Whether this CPU runs the VNNI kernels (checked once; the AVX2 ones give the same bits: q4k_linear_isa).
bool use_vnni();
// isa: "" the best this CPU has, "avx2" or "vnni" one of them (the tests): whether the VNNI kernels run
bool vnni_for(const std::string& isa);

}  // namespace specviz_gguf
