// The lean decoder's small ops between its products, one call each (specviz.models.lean): RMSNorm with the
// residual add before it, RoPE + the cache write + attention, and SiLU(gate) * up.  Written out, a layer ran ~45
// torch ops around its four products (~0.3 ms a layer of dispatch on a 2-core CPU, traced or not); here 4.
//
// Batch invariance, as the target needs it: every output row is computed from its own token's row alone, and a
// query's attention from its own visible slots in their order, by the same operations whatever else is in the
// pass (a one-token step, a verify pass, a tree pass).  Float sums run in a fixed order (8 partial lanes,
// then folded in order), compiled with -ffp-contract=off: no fused multiply-adds the compiler may or may not use.
#include "specviz_torch.h"
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

// sum of a[i] * b[i] over n, in 8 lanes (lane l takes i = l mod 8), the lanes then summed in order
inline float dot(const float* a, const float* b, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] = lane[l] + a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) lane[l] = lane[l] + a[i] * b[i];
  float s = lane[0];
  for (int l = 1; l < 8; ++l) s = s + lane[l];
  return s;
}

inline void rms_row(const float* x, const float* w, float eps, int64_t h, float* out) {
  const float r = 1.0f / std::sqrt(dot(x, x, h) / float(h) + eps);
  for (int64_t i = 0; i < h; ++i) out[i] = (x[i] * r) * w[i];
}

}  // namespace

// RMSNorm of each row of x [T, H] (float32): x * (1 / sqrt(mean(x^2) + eps)) * w.
sv::Tensor glue_rms(sv::Tensor x, sv::Tensor w, double eps) {
  SV_CHECK(x.scalar_type() == sv::kFloat32 && x.dim() == 2 && w.scalar_type() == sv::kFloat32, "float32 [T, H] rows");
  x = sv::contiguous(x);
  w = sv::contiguous(w);
  const int64_t t = x.size(0), h = x.size(1);
  auto out = sv::empty_like(x);
  const float *xp = sv::ptr<float>(x), *wp = sv::ptr<float>(w);
  float* op = sv::ptr<float>(out);
  for (int64_t r = 0; r < t; ++r) rms_row(xp + r * h, wp, float(eps), h, op + r * h);
  return out;
}

// The residual stream after a block, x + d, and its RMSNorm: (x + d, rms(x + d) * w).
std::tuple<sv::Tensor, sv::Tensor> glue_add_rms(sv::Tensor x, sv::Tensor d, sv::Tensor w, double eps) {
  SV_CHECK(x.dim() == 2 && d.dim() == 2 && x.size(0) == d.size(0) && x.size(1) == d.size(1) &&
              x.scalar_type() == sv::kFloat32 && d.scalar_type() == sv::kFloat32, "x and d: float32 [T, H] alike");
  x = sv::contiguous(x);
  d = sv::contiguous(d);
  auto sum = sv::empty({x.size(0), x.size(1)}, sv::options(x));
  const float *xp = sv::ptr<float>(x), *dp = sv::ptr<float>(d);
  float* sp = sv::ptr<float>(sum);
  for (int64_t i = 0, n = x.numel(); i < n; ++i) sp[i] = xp[i] + dp[i];  // one rounding each: torch's x + d, bit for bit
  return {sum, glue_rms(sum, w, eps)};
}

// exp(x) in eight lanes: Cephes' expf (x clamped to +-88.376, 2^n e^r with r = x - n ln 2 in two parts and a
// degree-6 polynomial for e^r; ~1 ulp), each lane alone.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f)), _mm256_set1_ps(88.3762626647949f));
  const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(0.5f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm256_add_ps(_mm256_mul_ps(p, x), _mm256_set1_ps(c));
  const __m256 y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, x), x), x), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// (g / (1 + exp(-g))) * u, lane by lane
inline __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

// SiLU(gate) * up for gate_up [T, 2I] (gate its first I columns): [T, I].
sv::Tensor glue_silu_mul(sv::Tensor gu) {
  SV_CHECK(gu.scalar_type() == sv::kFloat32 && gu.dim() == 2 && gu.size(1) % 2 == 0, "float32 [T, 2I]");
  gu = sv::contiguous(gu);
  const int64_t t = gu.size(0), i2 = gu.size(1), n = i2 / 2;
  auto out = sv::empty({t, n}, sv::options(gu));
  const float* gp = sv::ptr<float>(gu);
  float* op = sv::ptr<float>(out);
  // each output alone from its own gate and up, eight at a time (a stretch's last few through the same lanes: the
  // same bits wherever the threads split), so split across threads, the same bits.  With libm's expf one at a time
  // a verify pass's eight rows took ~150 us a layer on the Zen 5 EPYC (~4 ms of the target's pass)
  sv::parallel_for(0, t * n, 2048, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1;) {  // a row's stretch at a time
      const int64_t r = j / n, i0 = j % n, i1 = std::min(n, i0 + (j1 - j));
      const float *g = gp + r * i2, *u = g + n;
      float* o = op + r * n;
      int64_t i = i0;
      for (; i + 8 <= i1; i += 8) _mm256_storeu_ps(o + i, silu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
      if (i < i1) {
        float gb[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ub[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ob[8];
        std::copy(g + i, g + i1, gb);
        std::copy(u + i, u + i1, ub);
        _mm256_storeu_ps(ob, silu_mul8(_mm256_loadu_ps(gb), _mm256_loadu_ps(ub)));
        std::copy(ob, ob + (i1 - i), o + i);
      }
      j += i1 - i0;
    }
  });
  return out;
}

// One layer's attention block between its two products, for T tokens:
//   qkv [T, (nh + 2 kvh) d] (q, k, v side by side); cos, sin [cap, d] RoPE tables; pos [T] RoPE positions;
//   keys, values [1, kvh, cap, d] the layer's cache; slots [T] where each token's key and value are written;
//   vis [T, L] int64: the slots query t attends to, in order (its first lens[t]); or an empty tensor: slots
//   0 .. lens[t] - 1 (a chain).
// RoPE as transformers' rotate_half: x * cos + cat(-x[h:], x[:h]) * sin, each product rounded on its own.
// Every key and value is written before any query attends (a pass's tokens see each other as the mask says).
// Attention per (query, head), in float32: s_l = (q . k_l) * scaling over its visible slots in order; m = max;
// p_l = exp(s_l - m); out = (sum_l p_l v_l) / (sum_l p_l), both sums in slot order.  Returns [T, nh d].
sv::Tensor glue_attend(sv::Tensor qkv, sv::Tensor cos, sv::Tensor sin, sv::Tensor pos,
                          sv::Tensor keys, sv::Tensor values, sv::Tensor slots, sv::Tensor vis,
                          sv::Tensor lens, int64_t nh, int64_t kvh, double scaling) {
  SV_CHECK(qkv.scalar_type() == sv::kFloat32 && qkv.dim() == 2, "qkv: float32 [T, (nh + 2 kvh) d]");
  SV_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.scalar_type() == sv::kFloat32 &&
              values.scalar_type() == sv::kFloat32 && keys.dim() == 4, "the cache: contiguous float32 [1, kvh, cap, d]");
  qkv = sv::contiguous(qkv);
  cos = sv::contiguous(cos);
  sin = sv::contiguous(sin);
  pos = sv::contiguous(sv::to(pos, sv::kLong));
  slots = sv::contiguous(sv::to(slots, sv::kLong));
  lens = sv::contiguous(sv::to(lens, sv::kLong));
  const int64_t t = qkv.size(0), cap = keys.size(2), d = keys.size(3), half = d / 2;
  SV_CHECK(qkv.size(1) == (nh + 2 * kvh) * d && keys.size(1) == kvh && nh % kvh == 0, "qkv's width");
  SV_CHECK(pos.numel() == t && slots.numel() == t && lens.numel() == t, "pos, slots, lens: one a token");
  const bool chain = vis.numel() == 0;
  if (!chain) {
    vis = sv::contiguous(sv::to(vis, sv::kLong));
    SV_CHECK(vis.dim() == 2 && vis.size(0) == t, "vis: [T, L]");
  }
  const int64_t width = qkv.size(1), group = nh / kvh;
  const float *src = sv::ptr<float>(qkv), *cp = sv::ptr<float>(cos), *sp = sv::ptr<float>(sin);
  const int64_t *pp = sv::ptr<int64_t>(pos), *slp = sv::ptr<int64_t>(slots), *lp = sv::ptr<int64_t>(lens);
  float *kp = sv::ptr<float>(keys), *vp = sv::ptr<float>(values);
  auto q = sv::empty({t, nh, d}, sv::options(qkv));
  float* qp = sv::ptr<float>(q);
  auto rope = [&](const float* x, const float* c, const float* s, float* out) {
    for (int64_t i = 0; i < d; ++i) {
      const float rot = i < half ? -x[i + half] : x[i - half];
      out[i] = x[i] * c[i] + rot * s[i];
    }
  };
  for (int64_t r = 0; r < t; ++r) {
    const int64_t p = pp[r], slot = slp[r];
    SV_CHECK(p >= 0 && p < cos.size(0) && slot >= 0 && slot < cap, "a position or slot outside the tables");
    const float *row = src + r * width, *c = cp + p * d, *s = sp + p * d;
    for (int64_t h = 0; h < nh; ++h) rope(row + h * d, c, s, qp + (r * nh + h) * d);
    for (int64_t g = 0; g < kvh; ++g) {
      rope(row + (nh + g) * d, c, s, kp + (g * cap + slot) * d);
      const float* v = row + (nh + kvh + g) * d;
      std::copy(v, v + d, vp + (g * cap + slot) * d);
    }
  }
  const int64_t* visp = chain ? nullptr : sv::ptr<int64_t>(vis);
  const int64_t vis_w = chain ? 0 : vis.size(1);
  for (int64_t r = 0; r < t; ++r)
    SV_CHECK(lp[r] >= 1 && lp[r] <= (chain ? cap : vis_w), "a query sees no slot, or more than there are");
  auto out = sv::empty({t, nh * d}, sv::options(qkv));
  float* op = sv::ptr<float>(out);
  const float sc = float(scaling);
  sv::parallel_for(0, t * nh, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> score;
    std::vector<float> acc(d);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / nh, h = i % nh, g = h / group, n = lp[r];
      const float* qv = qp + (r * nh + h) * d;
      const int64_t* seen = chain ? nullptr : visp + r * vis_w;
      score.resize(n);
      float m = -INFINITY;
      for (int64_t l = 0; l < n; ++l) {
        const int64_t j = chain ? l : seen[l];
        score[l] = dot(qv, kp + (g * cap + j) * d, d) * sc;
        m = std::max(m, score[l]);
      }
      float total = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t l = 0; l < n; ++l) {
        const int64_t j = chain ? l : seen[l];
        const float e = std::exp(score[l] - m);
        total = total + e;
        const float* v = vp + (g * cap + j) * d;
        for (int64_t k = 0; k < d; ++k) acc[k] = acc[k] + e * v[k];
      }
      float* o = op + r * nh * d + h * d;
      for (int64_t k = 0; k < d; ++k) o[k] = acc[k] / total;
    }
  });
  return out;
}

STABLE_TORCH_LIBRARY_FRAGMENT(specviz, m) {
  m.def("glue_rms(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("glue_add_rms(Tensor x, Tensor d, Tensor w, float eps) -> (Tensor, Tensor)");
  m.def("glue_silu_mul(Tensor gu) -> Tensor");
  m.def("glue_attend(Tensor qkv, Tensor cos, Tensor sin, Tensor pos, Tensor(a!) keys, Tensor(b!) values, "
        "Tensor slots, Tensor vis, Tensor lens, int nh, int kvh, float scaling) -> Tensor");
}
STABLE_TORCH_LIBRARY_IMPL(specviz, CPU, m) {
  m.impl("glue_rms", TORCH_BOX(&glue_rms));
  m.impl("glue_add_rms", TORCH_BOX(&glue_add_rms));
  m.impl("glue_silu_mul", TORCH_BOX(&glue_silu_mul));
  m.impl("glue_attend", TORCH_BOX(&glue_attend));
}
