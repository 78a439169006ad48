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
// out[m, n] = A - B (+ bias[n]), in float32, each operation rounded on its own (-ffp-contract=off), where over the
// blocks b in order, per lane:
//   A: 8 lanes, lane l += (dx[m,b] * d[n,b]) * I_l,  I_l = sc[l] * (sum of q_i xq_i over sub-block l)
//   B: 4 lanes, lane l += (dx[m,b] * dmin[n,b]) * (mn[2l] bsum[2l] + mn[2l+1] bsum[2l+1])   (bsum: xq's sums of 32)
// (the lanes vpmaddwd and _mm_madd_epi16 leave; integer sums exact), then A = ((a_0 + a_1) + a_2) + ... + a_7 and
// B likewise over its 4 lanes.  No horizontal sum per block: ~1.6x the throughput of one.  Every output is computed
// alone from its own row and token in that order, so a token's output is the same bits whatever else is in the
// pass (a verify pass, a step).
// vpmaddubsw multiplies q (u8, 0..15) by xq (s8): its pair sums (<= 2 x 15 x 127) cannot saturate, and a block's
// eight of them add up in int16 (<= 8 x 3810 < 32767) before one vpmaddwd applies the scales: in the stored order
// int16 lane m is sub-block m / 2's, so the scales go in as [sc0 sc0 sc1 sc1 .. sc7 sc7], the same for the whole
// block (GGUF's own order needs a scale broadcast and a vpmaddwd per 32 weights: 1.4x the instructions).
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

// vpshufb mask: int16 lane m <- scale byte m / 2, zero-extended (in each 128-bit half, both holding the 8 scales)
alignas(32) const int8_t DUP[32] = {0, -128, 0, -128, 1, -128, 1, -128, 2, -128, 2, -128, 3, -128, 3, -128,
                                    4, -128, 4, -128, 5, -128, 5, -128, 6, -128, 6, -128, 7, -128, 7, -128};

// One row (kb * REC bytes) against T tokens (xq [T][K], dx [T][KB], bs int16 [T][KB*8], each token ld* apart), all
// K blocks; acc[t].  Each (row, token) goes through the same operations whatever T is: T only decides what is
// loaded once and shared.
template <int T>
inline void rows_tokens(const uint8_t* w, int64_t kb, const int8_t* xq, const float* dx, const int16_t* bs,
                        int64_t ldx, int64_t ldd, int64_t ldb, float* acc) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i dup = _mm256_load_si256(reinterpret_cast<const __m256i*>(DUP));
  __m256 a[T];   // per-lane sums of dx * d * (the lane's integer sum), lane l sub-block l's
  __m128 am[T];  // per-lane sums of dx * dmin * (mn . bsum), lanes as _mm_madd_epi16 leaves them
  for (int t = 0; t < T; ++t) {
    a[t] = _mm256_setzero_ps();
    am[t] = _mm_setzero_ps();
  }
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
    const __m256i sc = _mm256_shuffle_epi8(  // [sc0 sc0 sc1 sc1 .. sc7 sc7] as int16
        _mm256_broadcastq_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + 128))), dup);
    const __m128i mn = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + 136)));
    float d, dmin;
    std::memcpy(&d, rec + 144, 4);
    std::memcpy(&dmin, rec + 148, 4);
    for (int t = 0; t < T; ++t) {
      const float xd = dx[t * ldd + b];
      const __m128i bsum = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bs + t * ldb + b * 8));
      const __m128i m4 = _mm_madd_epi16(mn, bsum);  // lane i: mn[2i] bsum[2i] + mn[2i+1] bsum[2i+1] (exact)
      const __m256i v = _mm256_madd_epi16(p[t], sc);  // lane l: sc[l] x sub-block l's sum (exact)
      a[t] = _mm256_add_ps(a[t], _mm256_mul_ps(_mm256_set1_ps(xd * d), _mm256_cvtepi32_ps(v)));
      am[t] = _mm_add_ps(am[t], _mm_mul_ps(_mm_set1_ps(xd * dmin), _mm_cvtepi32_ps(m4)));
    }
  }
  for (int t = 0; t < T; ++t) acc[t] = in_order(a[t]) - in_order(am[t]);
}

// The same outputs with AVX-512 VNNI (256-bit vpdpbusd, where the CPU has avx512_vnni and avx512vl: Ice Lake and
// later Xeons, Zen 4 and later): in the stored order a 32-bit lane's four bytes are one sub-block's, so vpdpbusd
// sums sub-block l's q . xq in int32 lane l directly (exact: <= 32 x 15 x 127), one instruction where AVX2 needs
// vpmaddubsw and vpaddw; the scale then as an exact float product (below: the integer vpmaddwd gave).  The float
// operations are the AVX2 kernel's, in the same order: the same bits (tests/test_q4k.py runs both against the oracle).
// rows_tokens_vnni's work for one token, in two pieces that rows_pairs' odd token runs too (the same operations,
// so the same bits, by construction).  Chunk c: its 32 bytes of low and high nibbles (lo, hi) into the token's two
// vpdpbusd chains, x the token's activations of the chunk.
SPECVIZ_VNNI __attribute__((always_inline)) inline void vnni_chunk(__m256i& p, __m256i& p2, __m256i lo, __m256i hi,
                                                                   const int8_t* x) {
  p = _mm256_dpbusd_epi32(p, lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  p2 = _mm256_dpbusd_epi32(p2, hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32)));
}

// A block's end for one token: a += (dx * d) * (S * sc), am += (dx * dmin) * (mn . bsum), lane by lane, with dx
// the token's scale of the block (xd) and bsum its sums of 32.
SPECVIZ_VNNI __attribute__((always_inline)) inline void vnni_block(__m256& a, __m128& am, __m256i p, __m256i p2,
                                                                   __m256 sc, __m256 d, __m128i mn, __m128 dmin,
                                                                   const float* xd, const int16_t* bsum) {
  // dx * d in every lane: the same rounding as the scalar product, without moving it to a vector
  const __m256 x = _mm256_broadcast_ss(xd);
  const __m128i m4 = _mm_madd_epi16(mn, _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsum)));
  const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(p, p2)), sc);
  a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_mul_ps(x, d), v));
  am = _mm_add_ps(am, _mm_mul_ps(_mm_mul_ps(_mm256_castps256_ps128(x), dmin), _mm_cvtepi32_ps(m4)));
}

template <int T>
SPECVIZ_VNNI void rows_tokens_vnni(const uint8_t* w, int64_t kb, const int8_t* xq, const float* dx, const int16_t* bs,
                                   int64_t ldx, int64_t ldd, int64_t ldb, float* acc) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256 a[T];
  __m128 am[T];
  for (int t = 0; t < T; ++t) {
    a[t] = _mm256_setzero_ps();
    am[t] = _mm_setzero_ps();
  }
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
    // sc[l] x S as a float product: both exact in float and |S sc| <= 60960 x 63 < 2^24, so the product is
    // exact, the integer vpmaddwd / vpmulld would give, in two uops where vpmulld and its conversion take three
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + 128))));
    const __m128i mn = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + 136)));
    const __m256 d = _mm256_broadcast_ss(reinterpret_cast<const float*>(rec + 144));
    const __m128 dmin = _mm_broadcast_ss(reinterpret_cast<const float*>(rec + 148));
    for (int t = 0; t < T; ++t)
      vnni_block(a[t], am[t], p[t], p2[t], sc, d, mn, dmin, dx + t * ldd + b, bs + t * ldb + b * 8);
  }
  for (int t = 0; t < T; ++t) acc[t] = in_order(a[t]) - in_order(am[t]);
}


// ---- Q4_K with AVX-512 VNNI, two tokens a 512-bit register (q4k.h: the layout and the driver) ----
// AMX Xeon, the target's gate/up from memory, interleaved medians against the single-token kernel eight tokens a
// pass: 1.05x at 5 tokens, 1.11x at 6, 1.28x at 8, 1.19x at 29 (a prompt); down 1.02-1.03x at 6-8, 1.12x at 29.
// R rows (each kb * REC bytes, the next row's right after) against P pairs (pair p's arrays at xz + p * 2K,
// dz + p * kb * 16, ...) and, with ODD, one token more (x1, d1, b1: its xq, dx and sums as rows_tokens_vnni reads
// them); row r's outputs at acc[r * 9 ..]: acc[r * 9 + 2p], acc[r * 9 + 2p + 1], and the odd one's at acc[r * 9 + 2P].
// Two rows share each activation load (the down product's 8 tokens x 8,960 inputs, 72 KB, outgrow L1: one row at a
// time read them from L2 once a row) and each min product: a zmm holds both rows' four min lanes of a pair's two
// tokens, [row 0: token 2p, 2p + 1 | row 1: token 2p, 2p + 1], each lane through the operations above.
template <int R, int P, bool ODD>
SPECVIZ_VNNI_Z void rows_pairs(const uint8_t* w, int64_t kb, const int8_t* xz, const float* dz, const float* dm,
                               const int16_t* bz, const int8_t* x1, const float* d1, const int16_t* b1, float* acc) {
  static_assert(R == 1 || R == 2, "one row or two");
  const int64_t K = kb * 256, ld = kb * REC;
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 a[R][P], am[P];  // am: R == 1 uses the low half
  __m256 a1[R];
  __m128 am1[R];
  for (int t = 0; t < P; ++t) {
    am[t] = _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) a[r][t] = _mm512_setzero_ps();
  }
  for (int r = 0; r < R; ++r) {
    a1[r] = _mm256_setzero_ps();
    am1[r] = _mm_setzero_ps();
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
    __m512 sc[R], d[R];
    __m256 sc8[R];
    __m128i mn8[R];
    for (int r = 0; r < R; ++r) {
      sc8[r] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec[r] + 128))));
      sc[r] = _mm512_insertf32x8(_mm512_castps256_ps512(sc8[r]), sc8[r], 1);
      mn8[r] = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec[r] + 136)));
      d[r] = _mm512_set1_ps(*reinterpret_cast<const float*>(rec[r] + 144));
    }
    // both rows' mins (each for the pair's two tokens) and dmins, as the pair's min lanes line up
    const __m512i mn = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(mn8[0])),
                                          _mm256_broadcastsi128_si256(mn8[R - 1]), 1);
    const __m512 dmin = _mm512_insertf32x8(_mm512_set1_ps(*reinterpret_cast<const float*>(rec[0] + 148)),
                                           _mm256_set1_ps(*reinterpret_cast<const float*>(rec[R - 1] + 148)), 1);
    for (int t = 0; t < P; ++t) {
      const __m512 x = _mm512_loadu_ps(dz + (t * kb + b) * 16);
      for (int r = 0; r < R; ++r)
        a[r][t] = _mm512_add_ps(a[r][t], _mm512_mul_ps(_mm512_mul_ps(x, d[r]),
                                                       _mm512_mul_ps(_mm512_cvtepi32_ps(p[r][t]), sc[r])));
      const __m512i bsum = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bz + (t * kb + b) * 16)));
      const __m512 xm = _mm512_broadcast_f32x8(_mm256_loadu_ps(dm + (t * kb + b) * 8));
      am[t] = _mm512_add_ps(am[t], _mm512_mul_ps(_mm512_mul_ps(xm, dmin), _mm512_cvtepi32_ps(_mm512_madd_epi16(mn, bsum))));
    }
    if constexpr (ODD)  // rows_tokens_vnni's operations for one token
      for (int r = 0; r < R; ++r)
        vnni_block(a1[r], am1[r], q1[r], q2[r], sc8[r], _mm512_castps512_ps256(d[r]), mn8[r],
                   _mm512_castps512_ps128(r == 0 ? dmin : _mm512_shuffle_f32x4(dmin, dmin, 0xEE)), d1 + b, b1 + b * 8);
  }
  for (int r = 0; r < R; ++r) {
    if constexpr (P < 3) {  // lane sums one output at a time (four or fewer: the transposes cost more)
      for (int t = 0; t < P; ++t) {
        const __m256 m = r == 0 ? _mm512_castps512_ps256(am[t]) : _mm512_extractf32x8_ps(am[t], 1);
        acc[9 * r + 2 * t] = in_order(_mm512_castps512_ps256(a[r][t])) - in_order(_mm256_castps256_ps128(m));
        acc[9 * r + 2 * t + 1] = in_order(_mm512_extractf32x8_ps(a[r][t], 1)) - in_order(_mm256_extractf128_ps(m, 1));
      }
      if constexpr (ODD) acc[9 * r + 2 * P] = in_order(a1[r]) - in_order(am1[r]);
      continue;
    }
    // every output's lanes summed in order, eight outputs at once (unused: zeros)
    __m256 v[8], m[4];
    for (int t = 0; t < 4; ++t) {
      v[t] = t < P ? _mm512_castps512_ps256(a[r][t % P]) : _mm256_setzero_ps();
      v[4 + t] = t < P ? _mm512_extractf32x8_ps(a[r][t % P], 1) : _mm256_setzero_ps();
      m[t] = t >= P ? _mm256_setzero_ps() : r == 0 ? _mm512_castps512_ps256(am[t % P]) : _mm512_extractf32x8_ps(am[t % P], 1);
    }
    put8(_mm256_sub_ps(in_order8(v), in_order4x8(m)), acc + 9 * r);
    if constexpr (ODD) acc[9 * r + 2 * P] = in_order(a1[r]) - in_order(am1[r]);
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
