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
// Activations: each token's blocks of 256 quantized to int8 with one float scale a block (quantize_blocks, csrc/q4k.h), in
// the weights' order, and the sums of each 16 of them.  out[m, n] = sum over blocks b, in order, of 8 float lanes
//   lane l += (dx[m,b] * d[n,b]) * (I_l - 32 J_l)
// where I_l = sc[2l] (q . xq over sub-block 2l) + sc[2l+1] (q . xq over 2l + 1) and J_l = sc[2l] bsum[2l] +
// sc[2l+1] bsum[2l+1] (integer, exact), then the lanes summed in order: each output computed alone from its own
// row and token, whatever else is in the pass.
// vpmaddubsw multiplies q (u8, 0..63) by xq (s8): its pair sums (<= 2 x 63 x 127) cannot saturate, and two groups'
// add up in int16 (<= 32004) before vpmaddwd applies the block's sixteen scales as they are (int16 lane m is
// sub-block m's).

#include "q4k.h"

namespace {

using namespace specviz_gguf;

constexpr int64_t REC6 = 212;
// Token pairs a pass when two rows go together: four spilled registers (Zen 5 EPYC, the target's down at 8 tokens,
// weights from memory: 0.85 ms with four pairs, 0.65 with two).
constexpr int PAIRS_TWO_ROWS = 2;

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
                           const float*, int64_t ldx, int64_t ldd, int64_t ldb, float* acc) {
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
                                      const float*, int64_t ldx, int64_t ldd, int64_t ldb, float* acc) {
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

// The same outputs with AVX-512 VNNI, two tokens a zmm (q4k.h's pair layout) and two rows sharing each activation
// load: every lane through q6_rows_tokens_vnni's operations (the same bits).  The odd token of a pass goes through
// that kernel itself after the pairs (its row is in L1 by then).
SPECVIZ_VNNI_Z inline __m512i both_halves(const uint8_t* p) {  // 32 bytes, in both halves of a zmm
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <int R, int P, bool ODD>
SPECVIZ_VNNI_Z void q6_rows_pairs(const uint8_t* w, int64_t kb, const int8_t* xz, const float* dz, const float*,
                                  const int16_t* bz, const int8_t* x1, const float* d1, const int16_t* b1, const float*,
                                  float* acc) {
  static_assert(R == 1 || R == 2, "one row or two");
  const int64_t K = kb * 256, ld = kb * REC6;
  const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x30);
  __m512 a[R][P];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < P; ++t) a[r][t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    const uint8_t* rec[R];
    __m512i s16[R], v[R][P];
    for (int r = 0; r < R; ++r) {
      rec[r] = w + r * ld + b * REC6;
      prefetch(rec[r] + PF);
      prefetch(rec[r] + PF + 96);
      prefetch(rec[r] + PF + 192);
      s16[r] = _mm512_broadcast_i64x4(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec[r] + 192))));
      for (int t = 0; t < P; ++t) {  // -32 J, both tokens' (their sums side by side)
        const __m512i sums = _mm512_loadu_si512(bz + (t * kb + b) * 32);
        v[r][t] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(_mm512_madd_epi16(s16[r], sums), 5));
      }
    }
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 4; i += 2) {  // groups 4h + i and 4h + i + 1, as q6_values unpacks them
        __m512i q0[R], q1[R];
        for (int r = 0; r < R; ++r) {
          const __m512i A = both_halves(rec[r] + 64 * h), B = both_halves(rec[r] + 64 * h + 32),
                        H = both_halves(rec[r] + 128 + 32 * h);
          if (i == 0) {
            q0[r] = _mm512_or_si512(_mm512_and_si512(A, m4), _mm512_and_si512(_mm512_slli_epi16(H, 4), m2));
            q1[r] = _mm512_or_si512(_mm512_and_si512(B, m4), _mm512_and_si512(_mm512_slli_epi16(H, 2), m2));
          } else {
            q0[r] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(A, 4), m4), _mm512_and_si512(H, m2));
            q1[r] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(B, 4), m4),
                                    _mm512_and_si512(_mm512_srli_epi16(H, 2), m2));
          }
        }
        for (int t = 0; t < P; ++t) {
          const int8_t* x = xz + t * 2 * K + 2 * (b * 256 + 128 * h + 32 * i);
          const __m512i x0 = _mm512_loadu_si512(x), xh = _mm512_loadu_si512(x + 64);
          for (int r = 0; r < R; ++r)
            v[r][t] = _mm512_dpwssd_epi32(v[r][t], _mm512_add_epi16(_mm512_maddubs_epi16(q0[r], x0),
                                                                     _mm512_maddubs_epi16(q1[r], xh)), s16[r]);
        }
      }
    for (int r = 0; r < R; ++r) {
      const __m512 dv = _mm512_set1_ps(*reinterpret_cast<const float*>(rec[r] + 208));
      for (int t = 0; t < P; ++t)
        a[r][t] = _mm512_add_ps(a[r][t], _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(dz + (t * kb + b) * 16), dv),
                                                       _mm512_cvtepi32_ps(v[r][t])));
    }
  }
  for (int r = 0; r < R; ++r) {
    pair_sums<P>(a[r], acc + 9 * r);
    if constexpr (ODD) q6_rows_tokens_vnni<1>(w + r * ld, kb, x1, d1, b1, nullptr, K, kb, kb * 16, acc + 9 * r + 2 * P);
  }
}

}  // namespace

// Q6_K records [N, K/256, 212] (above)
sv::Tensor q6k_linear_isa(sv::Tensor x, sv::Tensor w, std::optional<sv::Tensor> bias, std::string isa) {
  // a one-token step has nothing to pair: straight to the one-token kernel, without the pairs' layout
  if (vnni_for(isa) && x.dim() == 2 && x.size(0) > 1)
    return paired_linear<16, PAIRS_TWO_ROWS>(x, w, bias, REC6, [](auto rows, auto pairs, auto odd, auto... args) {
      q6_rows_pairs<decltype(rows)::value, decltype(pairs)::value, decltype(odd)::value>(args...);
    });
  if (vnni_for(isa))
    return blocked_linear<16>(x, w, bias, REC6, [](auto t, auto... args) { q6_rows_tokens_vnni<decltype(t)::value>(args...); });
  return blocked_linear<16>(x, w, bias, REC6, [](auto t, auto... args) { q6_rows_tokens<decltype(t)::value>(args...); });
}

sv::Tensor q6k_linear(sv::Tensor x, sv::Tensor w, std::optional<sv::Tensor> bias) {
  return q6k_linear_isa(x, w, bias, "");
}

STABLE_TORCH_LIBRARY_FRAGMENT(specviz, m) {
  m.def("q6k_linear(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.def("q6k_linear_isa(Tensor x, Tensor w, Tensor? bias, str isa) -> Tensor");
}
STABLE_TORCH_LIBRARY_IMPL(specviz, CPU, m) {
  m.impl("q6k_linear", TORCH_BOX(&q6k_linear));
  m.impl("q6k_linear_isa", TORCH_BOX(&q6k_linear_isa));
}
