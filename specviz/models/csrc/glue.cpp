// The lean decoder's small ops between its products, one call each (specviz.models.lean): RMSNorm with the
// residual add before it, RoPE + the cache write + attention, and SiLU(gate) * up.  Written out, a layer ran ~45
// torch ops around its four products (~0.3 ms a layer of dispatch on a 2-core CPU, traced or not); here 4.
//
// Batch invariance, as the target needs it: every output row is computed from its own token's row alone, and a
// query's attention from its own visible slots in their order, by the same operations whatever else is in the
// pass (a one-token step, a verify pass, a tree pass).  Float sums run in a fixed order (8 partial lanes,
// then folded in order), compiled with -ffp-contract=off: no fused multiply-adds the compiler may or may not use.
#include "specviz_torch.h"
#include <ATen/Parallel.h>
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
torch::Tensor glue_rms(torch::Tensor x, torch::Tensor w, double eps) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2 && w.dtype() == torch::kFloat32, "float32 [T, H] rows");
  x = x.contiguous();
  w = w.contiguous();
  const int64_t t = x.size(0), h = x.size(1);
  auto out = torch::empty_like(x);
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t r = 0; r < t; ++r) rms_row(xp + r * h, wp, float(eps), h, op + r * h);
  return out;
}

// The residual stream after a block, x + d, and its RMSNorm: (x + d, rms(x + d) * w).
std::tuple<torch::Tensor, torch::Tensor> glue_add_rms(torch::Tensor x, torch::Tensor d, torch::Tensor w, double eps) {
  TORCH_CHECK(x.sizes() == d.sizes() && x.dtype() == torch::kFloat32 && d.dtype() == torch::kFloat32,
              "x and d: float32 [T, H] alike");
  auto sum = (x.contiguous() + d.contiguous()).contiguous();  // torch's add: the same bits as x + d before
  return {sum, glue_rms(sum, w, eps)};
}

// SiLU(gate) * up for gate_up [T, 2I] (gate its first I columns): [T, I].
torch::Tensor glue_silu_mul(torch::Tensor gu) {
  TORCH_CHECK(gu.dtype() == torch::kFloat32 && gu.dim() == 2 && gu.size(1) % 2 == 0, "float32 [T, 2I]");
  gu = gu.contiguous();
  const int64_t t = gu.size(0), i2 = gu.size(1), n = i2 / 2;
  auto out = torch::empty({t, n}, gu.options());
  const float* gp = gu.data_ptr<float>();
  float* op = out.data_ptr<float>();
  // each output alone from its own gate and up (so split across threads, the same bits): the target's 8,960-wide
  // rows took ~50 us each on one core of the Zen 3 EPYC, a verify pass's four rows ~0.2 ms a layer
  at::parallel_for(0, t * n, 2048, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1;) {  // a row's stretch at a time
      const int64_t r = j / n, i0 = j % n, i1 = std::min(n, i0 + (j1 - j));
      const float *g = gp + r * i2, *u = g + n;
      float* o = op + r * n;
      for (int64_t i = i0; i < i1; ++i) o[i] = (g[i] / (1.0f + std::exp(-g[i]))) * u[i];
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
torch::Tensor glue_attend(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor pos,
                          torch::Tensor keys, torch::Tensor values, torch::Tensor slots, torch::Tensor vis,
                          torch::Tensor lens, int64_t nh, int64_t kvh, double scaling) {
  TORCH_CHECK(qkv.dtype() == torch::kFloat32 && qkv.dim() == 2, "qkv: float32 [T, (nh + 2 kvh) d]");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.dtype() == torch::kFloat32 &&
              values.dtype() == torch::kFloat32 && keys.dim() == 4, "the cache: contiguous float32 [1, kvh, cap, d]");
  qkv = qkv.contiguous();
  cos = cos.contiguous();
  sin = sin.contiguous();
  pos = pos.to(torch::kLong).contiguous();
  slots = slots.to(torch::kLong).contiguous();
  lens = lens.to(torch::kLong).contiguous();
  const int64_t t = qkv.size(0), cap = keys.size(2), d = keys.size(3), half = d / 2;
  TORCH_CHECK(qkv.size(1) == (nh + 2 * kvh) * d && keys.size(1) == kvh && nh % kvh == 0, "qkv's width");
  TORCH_CHECK(pos.numel() == t && slots.numel() == t && lens.numel() == t, "pos, slots, lens: one a token");
  const bool chain = vis.numel() == 0;
  if (!chain) {
    vis = vis.to(torch::kLong).contiguous();
    TORCH_CHECK(vis.dim() == 2 && vis.size(0) == t, "vis: [T, L]");
  }
  const int64_t width = qkv.size(1), group = nh / kvh;
  const float *src = qkv.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  const int64_t *pp = pos.data_ptr<int64_t>(), *slp = slots.data_ptr<int64_t>(), *lp = lens.data_ptr<int64_t>();
  float *kp = keys.data_ptr<float>(), *vp = values.data_ptr<float>();
  auto q = torch::empty({t, nh, d}, qkv.options());
  float* qp = q.data_ptr<float>();
  auto rope = [&](const float* x, const float* c, const float* s, float* out) {
    for (int64_t i = 0; i < d; ++i) {
      const float rot = i < half ? -x[i + half] : x[i - half];
      out[i] = x[i] * c[i] + rot * s[i];
    }
  };
  for (int64_t r = 0; r < t; ++r) {
    const int64_t p = pp[r], slot = slp[r];
    TORCH_CHECK(p >= 0 && p < cos.size(0) && slot >= 0 && slot < cap, "a position or slot outside the tables");
    const float *row = src + r * width, *c = cp + p * d, *s = sp + p * d;
    for (int64_t h = 0; h < nh; ++h) rope(row + h * d, c, s, qp + (r * nh + h) * d);
    for (int64_t g = 0; g < kvh; ++g) {
      rope(row + (nh + g) * d, c, s, kp + (g * cap + slot) * d);
      const float* v = row + (nh + kvh + g) * d;
      std::copy(v, v + d, vp + (g * cap + slot) * d);
    }
  }
  const int64_t* visp = chain ? nullptr : vis.data_ptr<int64_t>();
  const int64_t vis_w = chain ? 0 : vis.size(1);
  for (int64_t r = 0; r < t; ++r)
    TORCH_CHECK(lp[r] >= 1 && lp[r] <= (chain ? cap : vis_w), "a query sees no slot, or more than there are");
  auto out = torch::empty({t, nh * d}, qkv.options());
  float* op = out.data_ptr<float>();
  const float sc = float(scaling);
  at::parallel_for(0, t * nh, 1, [&](int64_t i0, int64_t i1) {
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

TORCH_LIBRARY_FRAGMENT(specviz, m) {
  m.def("glue_rms(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("glue_add_rms(Tensor x, Tensor d, Tensor w, float eps) -> (Tensor, Tensor)");
  m.def("glue_silu_mul(Tensor gu) -> Tensor");
  m.def("glue_attend(Tensor qkv, Tensor cos, Tensor sin, Tensor pos, Tensor(a!) keys, Tensor(b!) values, "
        "Tensor slots, Tensor vis, Tensor lens, int nh, int kvh, float scaling) -> Tensor");
}
TORCH_LIBRARY_IMPL(specviz, CPU, m) {
  m.impl("glue_rms", &glue_rms);
  m.impl("glue_add_rms", &glue_add_rms);
  m.impl("glue_silu_mul", &glue_silu_mul);
  m.impl("glue_attend", &glue_attend);
}
