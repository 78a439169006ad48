// GGUF's Q4_K weights as they are, times float32 activations (AVX2, AVX-512 VNNI): the target's linears at 0.59 bytes
// a weight where int8 reads 1.0, batch-invariant (its Q6_K ones: csrc/q6k.cpp; what both share: csrc/q4k.h).
//
// Weights (specviz.models.q4k): one 152-byte record per row and block of 256 weights,
//   qs[128]   the block's 4-bit values in the kernel's order (q4k.STORED): 32 bytes a chunk c, its low nibbles
//             group k = 2c, its high nibbles group k = 2c + 1, where group k's byte p is sub-block p / 4's value
//             4k + p % 4 (so each 32-byte product spans all eight sub-blocks)
//   sc[8]     the 6-bit scales of the block's eight sub-blocks of 32, unpacked from GGUF's 12 bytes
//   mn[8]     the 6-bit mins, likewise
//   d, dmin   float32 (GGUF's fp16, widened)
// so that w = d * sc[j] * q - dmin * mn[j] for a weight q (0..15) of sub-block j: llama.cpp's dequantization.
//
// Activations: each token's 256-value blocks quantized to int8 with one float scale a block (llama.cpp's Q8_K
// idea): dx = amax / 127, xq = round-to-nearest-even(x * (127 / amax)), stored in the weights' order, and the
// eight sub-block sums of xq.
//
// out[m, n] (+ bias[n]) in float32, over the blocks b in order, per lane l (sub-block l, 8 lanes):
//   a_l = fma(dsc_l, S_l * dx[m,b], a_l),  then  a_l = fnmadd(dmn_l, y_l, a_l)
// with S_l = sum of q_i xq_i over sub-block l (integer, exact; exact in float: |S| <= 32 x 15 x 127 < 2^24),
// dsc_l = d[n,b] * sc[l], dmn_l = dmin[n,b] * mn[l] (made once a row's block) and y_l = dx[m,b] * bsum_l (once a
// call; bsum: xq's sums of 32), each product rounded once and each fma / fnmadd rounded once (-ffp-contract=off
// keeps every other operation as written), then out = ((a_0 + a_1) + a_2) + ... + a_7.  No horizontal sum per
// block.  Every output is computed alone from its own row and token in that order, so a token's output is the same
// bits whatever else is in the pass (a verify pass, a step).  Three float operations and a conversion a lane and
// block: fewer than half the earlier A - B form's (dx * d and dx * dmin per token and block, scales applied in
// integers, two accumulators and two lane sums), which held a verify pass's products to ~30 % of the VNNI peak.
// vpmaddubsw multiplies q (u8, 0..15) by xq (s8): its pair sums (<= 2 x 15 x 127) cannot saturate, and a block's
// eight of them add up in int16 (<= 8 x 3810 < 32767) before one vpmaddwd by ones gives the lanes' S: in the stored
// order int16 lane m is sub-block m / 2's.
#include "q4k.h"

namespace specviz_gguf {

// Whether this CPU runs the VNNI kernels (checked once; the AVX2 ones give the same bits: q4k_linear_isa).
bool use_vnni() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw");
  }();
  return yes;
}

// isa: "" the best this CPU has, "avx2" or "vnni" one of them (the tests): whether the VNNI kernels run
bool vnni_for(const std::string& isa) {
  SV_CHECK(isa.empty() || isa == "vnni" || isa == "avx2", "isa must be '', 'avx2' or 'vnni'");
  return isa.empty() ? use_vnni() : isa == "vnni";
}

}  // namespace specviz_gguf

namespace {

using namespace specviz_gguf;

constexpr int64_t REC = 152;  // bytes of one row's block of 256 weights

// A block's scales as float lanes: d * sc[l] (dsc) and dmin * mn[l] (dmn), lane l sub-block l's (one rounding each).
inline __m256 scales8(const uint8_t* six_bits, const uint8_t* unit) {
  const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(six_bits))));
  return _mm256_mul_ps(_mm256_broadcast_ss(reinterpret_cast<const float*>(unit)), v);
}

// A block's end for one token, lane by lane, S the lane's integer sum and dx the token's scale (xd): a =
// fma(dsc, S * dx, a), then a = fnmadd(dmn, y, a) (y = dx * bsum).  Every kernel gives every lane these operations.
inline void block_end(__m256& a, __m256i s, __m256 dsc, __m256 dmn, const float* xd, const float* y) {
  const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_broadcast_ss(xd));
  a = _mm256_fnmadd_ps(dmn, _mm256_loadu_ps(y), _mm256_fmadd_ps(dsc, u, a));
}

// One row (kb * REC bytes) against T tokens (xq [T][K], dx [T][KB], y [T][KB*8], each token ld* apart; bs unused),
// all K blocks; acc[t].  Each (row, token) goes through the same operations whatever T is: T only decides what is
// loaded once and shared.
template <int T>
inline void rows_tokens(const uint8_t* w, int64_t kb, const int8_t* xq, const float* dx, const int16_t*,
                        const float* y, int64_t ldx, int64_t ldd, int64_t, float* acc) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 a[T];  // lane l: sub-block l's terms so far
  for (int t = 0; t < T; ++t) a[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* rec = w + b * REC;
    prefetch(rec + PF);
    prefetch(rec + PF + 128);
    __m256i p[T];  // int16 lane m: sub-block m / 2's products so far (exact: <= 8 x 3810)
    for (int t = 0; t < T; ++t) p[t] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32 * c));
      const __m256i lo = _mm256_and_si256(q, low);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
      for (int t = 0; t < T; ++t) {
        const int8_t* x = xq + t * ldx + b * 256 + 64 * c;
        p[t] = _mm256_add_epi16(p[t], _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))));
        p[t] = _mm256_add_epi16(p[t], _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32))));
      }
    }
    const __m256 dsc = scales8(rec + 128, rec + 144), dmn = scales8(rec + 136, rec + 148);
    for (int t = 0; t < T; ++t)  // vpmaddwd by ones: lane l the sub-block's two int16 lanes summed (exact)
      block_end(a[t], _mm256_madd_epi16(p[t], ones), dsc, dmn, dx + t * ldd + b, y + t * ldd * 8 + b * 8);
  }
  for (int t = 0; t < T; ++t) acc[t] = in_order(a[t]);
}

// The same outputs with AVX-512 VNNI (256-bit vpdpbusd, where the CPU has avx512_vnni and avx512vl: Ice Lake and
// later Xeons, Zen 4 and later): in the stored order a 32-bit lane's four bytes are one sub-block's, so vpdpbusd
// sums sub-block l's q . xq in int32 lane l directly (exact: <= 32 x 15 x 127), one instruction where AVX2 needs
// vpmaddubsw and vpaddw.  The float operations are the AVX2 kernel's: the same bits (tests/test_q4k.py runs both
// against the oracle).  vnni_chunk is one token's work on chunk c (its 32 bytes of low and high nibbles, lo and hi)
// into its two vpdpbusd chains, x the token's activations of the chunk; rows_pairs' odd token runs it too.
SPECVIZ_VNNI __attribute__((always_inline)) inline void vnni_chunk(__m256i& p, __m256i& p2, __m256i lo, __m256i hi,
                                                                   const int8_t* x) {
  p = _mm256_dpbusd_epi32(p, lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  p2 = _mm256_dpbusd_epi32(p2, hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32)));
}

template <int T>
SPECVIZ_VNNI void rows_tokens_vnni(const uint8_t* w, int64_t kb, const int8_t* xq, const float* dx, const int16_t*,
                                   const float* y, int64_t ldx, int64_t ldd, int64_t, float* acc) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256 a[T];
  for (int t = 0; t < T; ++t) a[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* rec = w + b * REC;
    prefetch(rec + PF);
    prefetch(rec + PF + 128);
    __m256i p[T], p2[T];  // int32 lane l: sub-block l's sums (two chains, added at the end: exact)
    for (int t = 0; t < T; ++t) p[t] = p2[t] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32 * c));
      const __m256i lo = _mm256_and_si256(q, low);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
      for (int t = 0; t < T; ++t) vnni_chunk(p[t], p2[t], lo, hi, xq + t * ldx + b * 256 + 64 * c);
    }
    const __m256 dsc = scales8(rec + 128, rec + 144), dmn = scales8(rec + 136, rec + 148);
    for (int t = 0; t < T; ++t)
      block_end(a[t], _mm256_add_epi32(p[t], p2[t]), dsc, dmn, dx + t * ldd + b, y + t * ldd * 8 + b * 8);
  }
  for (int t = 0; t < T; ++t) acc[t] = in_order(a[t]);
}


// ---- Q4_K with AVX-512 VNNI, two tokens a 512-bit register (q4k.h: the layout and the driver) ----
// R rows (each kb * REC bytes, the next row's right after) against P pairs (pair p's arrays at xz + p * 2K,
// dz + p * kb * 16, yz + p * kb * 16) and, with ODD, one token more (x1, d1, y1: its xq, dx and y as
// rows_tokens_vnni reads them); row r's outputs at acc[9 r ..]: acc[9 r + 2p], acc[9 r + 2p + 1], and the odd one's
// at acc[9 r + 2P].  Every lane through block_end's operations: the same bits as one token at a time.
template <int R, int P, bool ODD>
SPECVIZ_VNNI_Z void rows_pairs(const uint8_t* w, int64_t kb, const int8_t* xz, const float* dz, const float* yz,
                               const int16_t*, const int8_t* x1, const float* d1, const int16_t*, const float* y1,
                               float* acc) {
  static_assert(R == 1 || R == 2, "one row or two");
  const int64_t K = kb * 256, ld = kb * REC;
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 a[R][P];
  __m256 a1[R];
  for (int r = 0; r < R; ++r) {
    a1[r] = _mm256_setzero_ps();
    for (int t = 0; t < P; ++t) a[r][t] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* rec[R];
    for (int r = 0; r < R; ++r) {
      rec[r] = w + r * ld + b * REC;
      prefetch(rec[r] + PF);
      prefetch(rec[r] + PF + 128);
    }
    __m512i p[R][P];  // int32 lane l: sub-block l's sums (one chain: the sums are exact in any order)
    __m256i q1[R], q2[R];
    for (int r = 0; r < R; ++r) {
      q1[r] = q2[r] = _mm256_setzero_si256();
      for (int t = 0; t < P; ++t) p[r][t] = _mm512_setzero_si512();
    }
    for (int c = 0; c < 4; ++c) {
      __m512i lo[R], hi[R];
      for (int r = 0; r < R; ++r) {
        const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec[r] + 32 * c)));
        lo[r] = _mm512_and_si512(q, low);
        hi[r] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low);
      }
      for (int t = 0; t < P; ++t) {
        const int8_t* x = xz + t * 2 * K + 2 * (b * 256 + 64 * c);
        const __m512i x0 = _mm512_loadu_si512(x), xh = _mm512_loadu_si512(x + 64);
        for (int r = 0; r < R; ++r) p[r][t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(p[r][t], lo[r], x0), hi[r], xh);
      }
      if constexpr (ODD)
        for (int r = 0; r < R; ++r)
          vnni_chunk(q1[r], q2[r], _mm512_castsi512_si256(lo[r]), _mm512_castsi512_si256(hi[r]), x1 + b * 256 + 64 * c);
    }
    for (int r = 0; r < R; ++r) {
      const __m256 dsc8 = scales8(rec[r] + 128, rec[r] + 144), dmn8 = scales8(rec[r] + 136, rec[r] + 148);
      const __m512 dsc = _mm512_insertf32x8(_mm512_castps256_ps512(dsc8), dsc8, 1);
      const __m512 dmn = _mm512_insertf32x8(_mm512_castps256_ps512(dmn8), dmn8, 1);
      for (int t = 0; t < P; ++t) {
        const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(p[r][t]), _mm512_loadu_ps(dz + (t * kb + b) * 16));
        a[r][t] = _mm512_fnmadd_ps(dmn, _mm512_loadu_ps(yz + (t * kb + b) * 16), _mm512_fmadd_ps(dsc, u, a[r][t]));
      }
      if constexpr (ODD)  // rows_tokens_vnni's operations for one token
        block_end(a1[r], _mm256_add_epi32(q1[r], q2[r]), dsc8, dmn8, d1 + b, y1 + b * 8);
    }
  }
  for (int r = 0; r < R; ++r) {
    pair_sums<P>(a[r], acc + 9 * r);
    if constexpr (ODD) acc[9 * r + 2 * P] = in_order(a1[r]);
  }
}

// q4k_linear_isa's VNNI path for two tokens or more (a one-token step takes rows_tokens_vnni: nothing to pair).
sv::Tensor pairs_linear(sv::Tensor x, sv::Tensor w, std::optional<sv::Tensor> bias) {
  return paired_linear<32>(x, w, bias, REC, [](auto rows, auto pairs, auto odd, auto... args) {
    rows_pairs<decltype(rows)::value, decltype(pairs)::value, decltype(odd)::value>(args...);
  });
}

}  // namespace

// Q4_K records [N, K/256, 152] (above)
sv::Tensor q4k_linear_isa(sv::Tensor x, sv::Tensor w, std::optional<sv::Tensor> bias, std::string isa) {
  // a one-token step has nothing to pair: straight to the one-token kernel, without the pairs' layout (~1.7 us a
  // product: ~0.16 ms of the draft's step, 97 products)
  if (vnni_for(isa) && x.dim() == 2 && x.size(0) > 1) return pairs_linear(x, w, bias);
  if (vnni_for(isa))
    return blocked_linear<32>(x, w, bias, REC, [](auto t, auto... args) { rows_tokens_vnni<decltype(t)::value>(args...); });
  return blocked_linear<32>(x, w, bias, REC, [](auto t, auto... args) { rows_tokens<decltype(t)::value>(args...); });
}

sv::Tensor q4k_linear(sv::Tensor x, sv::Tensor w, std::optional<sv::Tensor> bias) {
  return q4k_linear_isa(x, w, bias, "");
}
STABLE_TORCH_LIBRARY_FRAGMENT(specviz, m) {
  m.def("q4k_linear(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.def("q4k_linear_isa(Tensor x, Tensor w, Tensor? bias, str isa) -> Tensor");
}
STABLE_TORCH_LIBRARY_IMPL(specviz, CPU, m) {
  m.impl("q4k_linear", TORCH_BOX(&q4k_linear));
  m.impl("q4k_linear_isa", TORCH_BOX(&q4k_linear_isa));
}
