// GGUF's Q4_K weights as they are, times float32 activations (AVX2): the target's linears at 0.59 bytes a weight
// (and its Q6_K ones: the second part below)
// where int8 reads 1.0, batch-invariant.
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
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace {

constexpr int64_t REC = 152;  // bytes of one row's block of 256 weights
// Software prefetch PF bytes ahead in the row stream (a Q4_K record's bytes 0 and 128, a Q6_K one's 0, 96, 192): on the Zen 3
// EPYC, the models' eager steps in one process, with and without it interleaved, 12 reps, medians: the target's
// step 95.4 -> 84.2 ms (records in huge pages, models.hugepages), its pass over 4 tokens 153.9 -> 148.0, the
// draft's step 39.0 -> 34.7 (4 KiB pages).  (With the earlier kernel and 4 KiB pages it had measured slower.)
constexpr int64_t PF = 2048;
inline void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }

// vpshufb mask: int16 lane m <- scale byte m / 2, zero-extended (in each 128-bit half, both holding the 8 scales)
alignas(32) const int8_t DUP[32] = {0, -128, 0, -128, 1, -128, 1, -128, 2, -128, 2, -128, 3, -128, 3, -128,
                                    4, -128, 4, -128, 5, -128, 5, -128, 6, -128, 6, -128, 7, -128, 7, -128};

// A register's float lanes summed in order, ((l0 + l1) + l2) + ...: every kernel's last step (its bits).
inline float in_order(__m256 v) {
  float l[8];
  _mm256_storeu_ps(l, v);
  float s = l[0];
  for (int i = 1; i < 8; ++i) s = s + l[i];
  return s;
}
inline float in_order(__m128 v) {
  float l[4];
  _mm_storeu_ps(l, v);
  float s = l[0];
  for (int i = 1; i < 4; ++i) s = s + l[i];
  return s;
}

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
#define SPECVIZ_VNNI __attribute__((target("avx512vnni,avx512vl,avx512bw,avx512f,avx2,fma")))
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
      for (int t = 0; t < T; ++t) {
        const int8_t* x = xq + t * ldx + b * 256 + 64 * c;
        p[t] = _mm256_dpbusd_epi32(p[t], lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
        p2[t] = _mm256_dpbusd_epi32(p2[t], hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32)));
      }
    }
    // sc[l] x S as a float product: both exact in float and |S sc| <= 60960 x 63 < 2^24, so the product is
    // exact, the integer vpmaddwd / vpmulld would give, in two uops where vpmulld and its conversion take three
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + 128))));
    const __m128i mn = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + 136)));
    const __m256 d = _mm256_broadcast_ss(reinterpret_cast<const float*>(rec + 144));
    const __m128 dmin = _mm_broadcast_ss(reinterpret_cast<const float*>(rec + 148));
    for (int t = 0; t < T; ++t) {
      // dx * d in every lane: the same rounding as the scalar product, without moving it to a vector
      const __m256 xd = _mm256_broadcast_ss(dx + t * ldd + b);
      const __m128i bsum = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bs + t * ldb + b * 8));
      const __m128i m4 = _mm_madd_epi16(mn, bsum);
      const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(p[t], p2[t])), sc);
      a[t] = _mm256_add_ps(a[t], _mm256_mul_ps(_mm256_mul_ps(xd, d), v));
      am[t] = _mm_add_ps(am[t], _mm_mul_ps(_mm_mul_ps(_mm256_castps256_ps128(xd), dmin), _mm_cvtepi32_ps(m4)));
    }
  }
  for (int t = 0; t < T; ++t) acc[t] = in_order(a[t]) - in_order(am[t]);
}

// ---- Q6_K (specviz.models.q6k) ----
// GGUF's Q6_K weights as they are, times float32 activations (AVX2): the Q4_K_M target's other matrices (v and
// down in half its layers, and its head) at 0.83 bytes a weight where int8 reads 1.0, batch-invariant.
//
// Weights (specviz.models.q6k): one 212-byte record per row and block of 256 weights, GGUF's block_q6_K with d
// widened: ql[128] (low 4 bits), qh[64] (high 2 bits), sc[16] (int8 scales, one per 16 weights), d (float32).
// In each half h (128 values) and lane l (0..31), with A = ql[64h + l], B = ql[64h + 32 + l], H = qh[32h + l]:
//   v(128h + l)      = (A & 15) | (H & 3) << 4        v(128h + 32 + l) = (B & 15) | (H >> 2 & 3) << 4
//   v(128h + 64 + l) = (A >> 4) | (H >> 4 & 3) << 4   v(128h + 96 + l) = (B >> 4) | (H >> 6 & 3) << 4
// as llama.cpp's dequantize_row_q6_K unpacks them, but the values are in the kernel's order (q6k.STORED): group k
// (v(32k) .. v(32k + 31)) holds at byte p sub-block p / 2's weight 2k + p % 2, and w = d * sc[sub-block] * (q - 32).
//
// Activations: each token's blocks of 256 quantized to int8 with one float scale a block (quantize_blocks, below), in
// the weights' order, and the sums of each 16 of them.  out[m, n] = sum over blocks b, in order, of 8 float lanes
//   lane l += (dx[m,b] * d[n,b]) * (I_l - 32 J_l)
// where I_l = sc[2l] (q . xq over sub-block 2l) + sc[2l+1] (q . xq over 2l + 1) and J_l = sc[2l] bsum[2l] +
// sc[2l+1] bsum[2l+1] (integer, exact), then the lanes summed in order: each output computed alone from its own
// row and token, whatever else is in the pass.
// vpmaddubsw multiplies q (u8, 0..63) by xq (s8): its pair sums (<= 2 x 63 x 127) cannot saturate, and two groups'
// add up in int16 (<= 32004) before vpmaddwd applies the block's sixteen scales as they are (int16 lane m is
// sub-block m's).

constexpr int64_t REC6 = 212;

// Half h's four groups of values (0..63) from a record's ql / qh bytes, as unpacked above.
inline void q6_values(const uint8_t* rec, int h, __m256i q[4]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
  const __m256i A = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 64 * h));
  const __m256i B = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 64 * h + 32));
  const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 128 + 32 * h));
  q[0] = _mm256_or_si256(_mm256_and_si256(A, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m2));
  q[1] = _mm256_or_si256(_mm256_and_si256(B, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m2));
  q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4), _mm256_and_si256(H, m2));
  q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), m4), _mm256_and_si256(_mm256_srli_epi16(H, 2), m2));
}

// -32 J: the block's sixteen scales against a token's sums of 16 (bsum), lane l = -32 (sc[2l] bsum[2l] + ...).
inline __m256i q6_minus_32j(__m256i s16, const int16_t* bsum) {
  const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsum));
  return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(s16, sums), 5));
}

template <int T>
inline void q6_rows_tokens(const uint8_t* w, int64_t kb, const int8_t* xq, const float* dx, const int16_t* bs,
                       int64_t ldx, int64_t ldd, int64_t ldb, float* acc) {
  __m256 a[T];
  for (int t = 0; t < T; ++t) a[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* rec = w + b * REC6;
    prefetch(rec + PF);
    prefetch(rec + PF + 96);
    prefetch(rec + PF + 192);
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 192)));
    float d;
    std::memcpy(&d, rec + 208, 4);
    __m256i v[T];
    for (int t = 0; t < T; ++t) v[t] = q6_minus_32j(s16, bs + t * ldb + b * 16);
    for (int h = 0; h < 2; ++h) {
      __m256i q[4];
      q6_values(rec, h, q);
      for (int t = 0; t < T; ++t) {
        const int8_t* x = xq + t * ldx + b * 256 + 128 * h;
        for (int i = 0; i < 4; i += 2) {  // groups 4h + i and 4h + i + 1: int16 lane m sub-block m's (exact)
          const __m256i p = _mm256_add_epi16(
              _mm256_maddubs_epi16(q[i], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * i))),
              _mm256_maddubs_epi16(q[i + 1], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * i + 32))));
          v[t] = _mm256_add_epi32(v[t], _mm256_madd_epi16(p, s16));
        }
      }
    }
    for (int t = 0; t < T; ++t)
      a[t] = _mm256_add_ps(a[t], _mm256_mul_ps(_mm256_set1_ps(dx[t * ldd + b] * d), _mm256_cvtepi32_ps(v[t])));
  }
  for (int t = 0; t < T; ++t) acc[t] = in_order(a[t]);
}

// The same with AVX-512 VNNI: vpdpwssd applies the sixteen scales and adds in one instruction (v + p . s16, exact,
// non-saturating), where AVX2 needs vpmaddwd and vpaddd: the same integers, the same float operations, the same bits.
template <int T>
SPECVIZ_VNNI void q6_rows_tokens_vnni(const uint8_t* w, int64_t kb, const int8_t* xq, const float* dx, const int16_t* bs,
                                      int64_t ldx, int64_t ldd, int64_t ldb, float* acc) {
  __m256 a[T];
  for (int t = 0; t < T; ++t) a[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* rec = w + b * REC6;
    prefetch(rec + PF);
    prefetch(rec + PF + 96);
    prefetch(rec + PF + 192);
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 192)));
    float d;
    std::memcpy(&d, rec + 208, 4);
    __m256i v[T];
    for (int t = 0; t < T; ++t) v[t] = q6_minus_32j(s16, bs + t * ldb + b * 16);
    for (int h = 0; h < 2; ++h) {
      __m256i q[4];
      q6_values(rec, h, q);
      for (int t = 0; t < T; ++t) {
        const int8_t* x = xq + t * ldx + b * 256 + 128 * h;
        for (int i = 0; i < 4; i += 2) {
          const __m256i p = _mm256_add_epi16(
              _mm256_maddubs_epi16(q[i], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * i))),
              _mm256_maddubs_epi16(q[i + 1], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * i + 32))));
          v[t] = _mm256_dpwssd_epi32(v[t], p, s16);
        }
      }
    }
    const __m256 dv = _mm256_set1_ps(d);
    for (int t = 0; t < T; ++t)  // dx * d as a vector product: the scalar one's rounding
      a[t] = _mm256_add_ps(a[t], _mm256_mul_ps(_mm256_mul_ps(_mm256_broadcast_ss(dx + t * ldd + b), dv),
                                               _mm256_cvtepi32_ps(v[t])));
  }
  for (int t = 0; t < T; ++t) acc[t] = in_order(a[t]);
}

// ---- shared by both: the activations and the driver ----

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
  at::parallel_for(0, n_blocks, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float* xr = xp + (i / kb) * K_in + (i % kb) * 256;
      const int n = int(std::min<int64_t>(256, K_in - (i % kb) * 256));  // the block's real inputs
      quantize_block<G>(xr, n, qp + i * 256, dp + i, sp + i * (256 / G));
    }
  });
}

// x: float32 [M, K], K within w's last block of 256 (zero-padded to it); w: uint8 [N, ceil(K/256), rec]; bias: float32 [N] or none.  The activations
// quantized once (sums of G), then each row against MAXT tokens at a time, then the rest: four (AVX2's 16 registers),
// or up to eight with AVX-512's 32 (the VNNI kernels): kernel(std::integral_constant<int, T>, row, kb, xq, dx, sums,
// ldx, ldd, ldb, acc) gives a row's T outputs, each by the same operations whatever T is.  (Zen 3 EPYC: with the
// scales applied once a block, four fit the registers; a verify of 4 or 7 tokens ran ~15-20 % faster than as 3 + 1
// or 3 + 3 + 1.  AMX Xeon, VNNI, the target's gate/up from memory, interleaved medians: eight at a time against
// four, 1.04-1.07x at 5 and 6 tokens, 1.08-1.10x at 8, 1.17-1.19x at 29 (a prompt); the same at 1-4.  Q6_K's
// VNNI kernel keeps four: eight measured 0.94-1.02x on the head's rows, memory-bound there.  Four rows at
// a time for one token, sharing its loads, ran 2-3x slower with the weights coming from memory on the Zen 3.)
template <int G, int MAXT, class Kernel>
torch::Tensor blocked_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, int64_t rec,
                             Kernel kernel) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2, "x must be float32 [M, K]");
  TORCH_CHECK(w.dtype() == torch::kUInt8 && w.dim() == 3 && w.size(2) == rec, "w must be uint8 [N, K/256, ", rec, "]");
  w = w.contiguous();
  const int64_t kb = w.size(1);
  // a K short of a whole block (the draft's 896): the records' last block zero past K, x's missing inputs read as zeros
  TORCH_CHECK(x.size(1) <= kb * 256 && x.size(1) > kb * 256 - 256, "x's K must fill w's blocks of 256 but the last");
  x = x.contiguous();
  const int64_t M = x.size(0), K_in = x.size(1), K = kb * 256, N = w.size(0), S = 256 / G;
  const float* bp = nullptr;
  torch::Tensor bt;
  if (bias.has_value() && bias->defined()) {
    bt = bias->contiguous();
    TORCH_CHECK(bt.dtype() == torch::kFloat32 && bt.numel() == N, "bias must be float32 [N]");
    bp = bt.data_ptr<float>();
  }
  auto xq = torch::empty({M, K}, x.options().dtype(torch::kInt8));
  auto dx = torch::empty({M, kb}, x.options());
  auto bs = torch::empty({M, kb * S}, x.options().dtype(torch::kInt16));  // |sum| <= G x 127
  int8_t* qp = xq.data_ptr<int8_t>();
  float* dp = dx.data_ptr<float>();
  int16_t* sp = bs.data_ptr<int16_t>();
  quantize_blocks<G>(x.data_ptr<float>(), M * kb, kb, K_in, qp, dp, sp);
  auto out = torch::empty({M, N}, x.options());
  float* op = out.data_ptr<float>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  static_assert(MAXT == 4 || MAXT == 8, "four or eight tokens at a time");
  at::parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    float acc[MAXT];
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* wr = wp + n * kb * rec;
      auto run = [&](int64_t m, auto t) {
        kernel(t, wr, kb, qp + m * K, dp + m * kb, sp + m * kb * S, K, kb, kb * S, acc);
        for (int i = 0; i < decltype(t)::value; ++i) op[(m + i) * N + n] = bp ? acc[i] + bp[n] : acc[i];
      };
      int64_t m = 0;
      if constexpr (MAXT == 8) {
        for (; m + 8 <= M; m += 8) run(m, std::integral_constant<int, 8>{});
        switch (M - m) {  // the rest in one pass where it is more than four
          case 7: run(m, std::integral_constant<int, 7>{}); m += 7; break;
          case 6: run(m, std::integral_constant<int, 6>{}); m += 6; break;
          case 5: run(m, std::integral_constant<int, 5>{}); m += 5; break;
          default: break;
        }
      }
      for (; m + 4 <= M; m += 4) run(m, std::integral_constant<int, 4>{});
      for (; m + 3 <= M; m += 3) run(m, std::integral_constant<int, 3>{});
      for (; m + 2 <= M; m += 2) run(m, std::integral_constant<int, 2>{});
      for (; m < M; ++m) run(m, std::integral_constant<int, 1>{});
    }
  });
  return out;
}

}  // namespace

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
  TORCH_CHECK(isa.empty() || isa == "vnni" || isa == "avx2", "isa must be '', 'avx2' or 'vnni'");
  return isa.empty() ? use_vnni() : isa == "vnni";
}

// Q4_K records [N, K/256, 152] (above)
torch::Tensor q4k_linear_isa(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, std::string isa) {
  if (vnni_for(isa))
    return blocked_linear<32, 8>(x, w, bias, REC, [](auto t, auto... args) { rows_tokens_vnni<decltype(t)::value>(args...); });
  return blocked_linear<32, 4>(x, w, bias, REC, [](auto t, auto... args) { rows_tokens<decltype(t)::value>(args...); });
}

// Q6_K records [N, K/256, 212] (above)
torch::Tensor q6k_linear_isa(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias, std::string isa) {
  if (vnni_for(isa))
    return blocked_linear<16, 4>(x, w, bias, REC6, [](auto t, auto... args) { q6_rows_tokens_vnni<decltype(t)::value>(args...); });
  return blocked_linear<16, 4>(x, w, bias, REC6, [](auto t, auto... args) { q6_rows_tokens<decltype(t)::value>(args...); });
}

torch::Tensor q4k_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  return q4k_linear_isa(x, w, bias, "");
}
torch::Tensor q6k_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  return q6k_linear_isa(x, w, bias, "");
}

TORCH_LIBRARY_FRAGMENT(specviz, m) {
  m.def("q4k_linear(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.def("q6k_linear(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.def("q4k_linear_isa(Tensor x, Tensor w, Tensor? bias, str isa) -> Tensor");
  m.def("q6k_linear_isa(Tensor x, Tensor w, Tensor? bias, str isa) -> Tensor");
}
TORCH_LIBRARY_IMPL(specviz, CPU, m) {
  m.impl("q4k_linear", &q4k_linear);
  m.impl("q6k_linear", &q6k_linear);
  m.impl("q4k_linear_isa", &q4k_linear_isa);
  m.impl("q6k_linear_isa", &q6k_linear_isa);
}
