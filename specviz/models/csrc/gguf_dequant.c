/* GGUF blocks dequantized to gguf-py's float32 values, bit for bit (specviz/models/gguf_dequant.py); and, below,
 * Q4_K / Q6_K blocks made into the kernels' records at load (specviz/models/gguf_records.py).
 *
 * The arithmetic is gguf-py's (gguf/quants.py), in its order and in float32: a Q4_K value is
 * (d * sc) * q - dmin * m, a Q6_K value (d * sc) * q, a Q8_0 / Q5_0 value d * q.  Compiled with
 * -ffp-contract=off, so no multiply-add is fused (a fused one rounds once where numpy rounds twice).
 * Each value is then written as float32, as bfloat16 (torch's rounding: to nearest, ties to even; NaN
 * kept a NaN) or as float32 holding that bfloat16 value (what a converted cache's weight is once widened).
 *
 * Plain C, no torch headers: it compiles in well under a second, where the first start is waiting for it.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { OUT_F32 = 0, OUT_BF16 = 1, OUT_F32_OF_BF16 = 2 };
enum { Q8_0 = 8, Q5_0 = 6, Q4_K = 12, Q6_K = 14 };

static float f16_to_f32(const uint8_t *p) {
    uint32_t h = (uint32_t)p[0] | ((uint32_t)p[1] << 8);
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);  /* inf, NaN */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  /* subnormal: normalise */
        exp = 113;
        while (!(man & 0x400)) { man <<= 1; exp--; }
        bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;  /* NaN, as c10::BFloat16 */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static void store(const float *y, int64_t n, void *out, int64_t base, int kind) {
    if (kind == OUT_F32) {
        memcpy((float *)out + base, y, (size_t)n * 4);
    } else if (kind == OUT_BF16) {
        uint16_t *o = (uint16_t *)out + base;
        for (int64_t i = 0; i < n; i++) o[i] = bf16_bits(y[i]);
    } else {
        uint32_t *o = (uint32_t *)out + base;
        for (int64_t i = 0; i < n; i++) o[i] = (uint32_t)bf16_bits(y[i]) << 16;
    }
}

static void q8_0(const uint8_t *b, float *y) {
    float d = f16_to_f32(b);
    for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
}

static void q5_0(const uint8_t *b, float *y) {
    float d = f16_to_f32(b);
    uint32_t qh = (uint32_t)b[2] | ((uint32_t)b[3] << 8) | ((uint32_t)b[4] << 16) | ((uint32_t)b[5] << 24);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 32; j++) {
        int low = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
        int q = (low | (int)(((qh >> j) & 1u) << 4)) - 16;
        y[j] = d * (float)q;
    }
}

static void q4_k(const uint8_t *b, float *y) {
    float d = f16_to_f32(b), dmin = f16_to_f32(b + 2);
    const uint8_t *s = b + 4, *qs = b + 16;
    float ds[8], dm[8];
    for (int j = 0; j < 8; j++) {
        int sc, m;
        if (j < 4) {
            sc = s[j] & 63;
            m = s[j + 4] & 63;
        } else {
            sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
            m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
        ds[j] = d * (float)sc;
        dm[j] = dmin * (float)m;
    }
    for (int r = 0; r < 4; r++) {  /* 4 runs of 32 bytes: 32 low nibbles, then 32 high ones */
        const uint8_t *q = qs + 32 * r;
        float d0 = ds[2 * r], m0 = dm[2 * r], d1 = ds[2 * r + 1], m1 = dm[2 * r + 1];
        for (int j = 0; j < 32; j++) {
            float lo = d0 * (float)(q[j] & 0x0F);
            float hi = d1 * (float)(q[j] >> 4);
            y[64 * r + j] = lo - m0;
            y[64 * r + 32 + j] = hi - m1;
        }
    }
}

static void q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = f16_to_f32(b + 208);
    for (int h = 0; h < 2; h++) {  /* 2 halves of 128 values */
        for (int j = 0; j < 128; j++) {
            int low = j < 64 ? (ql[64 * h + j] & 0x0F) : (ql[64 * h + j - 64] >> 4);
            int high = (qh[32 * h + (j & 31)] >> (2 * (j >> 5))) & 3;
            int i = 128 * h + j;
            float scale = d * (float)sc[i >> 4];
            y[i] = scale * (float)((low | (high << 4)) - 32);
        }
    }
}

/* Blocks [first, first + count) of `blocks` (ggml type `type`) into `out` at their values' places.
 * Returns 0, or -1 for a type this file does not know. */
int specviz_dequantize(const uint8_t *blocks, int type, int64_t first, int64_t count, void *out, int kind) {
    int64_t size, per;
    void (*fn)(const uint8_t *, float *);
    switch (type) {
        case Q8_0: size = 34; per = 32; fn = q8_0; break;
        case Q5_0: size = 22; per = 32; fn = q5_0; break;
        case Q4_K: size = 144; per = 256; fn = q4_k; break;
        case Q6_K: size = 210; per = 256; fn = q6_k; break;
        default: return -1;
    }
    float y[256];
    for (int64_t i = first; i < first + count; i++) {
        fn(blocks + i * size, y);
        store(y, per, out, i * per, kind);
    }
    return 0;
}

/* ---- the kernels' records -------------------------------------------------------------------------------
 *
 * A record is the GGUF block with its 256 values in the kernel's order (one 32-byte product then spans every
 * sub-block: csrc/q4k.cpp, csrc/q6k.cpp), packed as GGUF packs them, its scales unpacked (Q4_K) and its fp16 d
 * widened to float32.  The orders are specviz.models.q4k.STORED and specviz.models.q6k.STORED; the numpy
 * functions there (q4k.records, q6k.records) are the reference, byte for byte (tests/test_gguf_native.py).
 * And float32 rows quantized to Q4_K records (a draft's other matrices): q4k.quantize's arithmetic in its order,
 * float32, round-half-even, no fused multiply-add, so the same bits.
 */
enum { Q4K_BLOCK = 144, Q4K_REC = 152, Q6K_BLOCK = 210, Q6K_REC = 212 };

/* 256 4-bit values (0..15) as GGUF packs them: byte 32c + j holds value 64c + j (low) and 64c + 32 + j (high) */
static void pack4(const uint8_t *v, uint8_t *out) {
    for (int c = 0; c < 4; c++)
        for (int j = 0; j < 32; j++) out[32 * c + j] = (uint8_t)(v[64 * c + j] | (v[64 * c + 32 + j] << 4));
}

static void unpack4(const uint8_t *q, uint8_t *v) {
    for (int c = 0; c < 4; c++)
        for (int j = 0; j < 32; j++) {
            v[64 * c + j] = q[32 * c + j] & 0x0F;
            v[64 * c + 32 + j] = q[32 * c + j] >> 4;
        }
}

/* The kernel's order as a transpose: Q4_K's values 32 s + 4 g + u (sub-block s, group g, u < 4) sit at
 * 32 g + 4 s + u, so in 4-byte units it is the 8 x 8 transpose; Q6_K's 16 s + 2 g + u (u < 2) sit at 32 g + 2 s + u,
 * in 2-byte units the 16 x 8 one.  (q4k.STORED and q6k.STORED say the same, value by value: tested.) */
static void q4k_order(const uint8_t *v, uint8_t *w) {
    uint32_t a[64], t[64];
    memcpy(a, v, 256);
    for (int s = 0; s < 8; s++)
        for (int g = 0; g < 8; g++) t[8 * g + s] = a[8 * s + g];
    memcpy(w, t, 256);
}

static void q6k_order(const uint8_t *v, uint8_t *w) {
    uint16_t a[128], t[128];
    memcpy(a, v, 256);
    for (int s = 0; s < 16; s++)
        for (int g = 0; g < 8; g++) t[16 * g + s] = a[8 * s + g];
    memcpy(w, t, 256);
}

static void q4k_record(const uint8_t *b, uint8_t *r) {
    uint8_t v[256], w[256];
    unpack4(b + 16, v);
    q4k_order(v, w);
    pack4(w, r);
    const uint8_t *s = b + 4;
    for (int j = 0; j < 4; j++) {
        r[128 + j] = s[j] & 63;
        r[136 + j] = s[4 + j] & 63;
        r[132 + j] = (uint8_t)((s[8 + j] & 0x0F) | ((s[j] >> 6) << 4));
        r[140 + j] = (uint8_t)((s[8 + j] >> 4) | ((s[4 + j] >> 6) << 4));
    }
    float d = f16_to_f32(b), dmin = f16_to_f32(b + 2);
    memcpy(r + 144, &d, 4);
    memcpy(r + 148, &dmin, 4);
}

static void q6k_record(const uint8_t *b, uint8_t *r) {
    const uint8_t *ql = b, *qh = b + 128;
    uint8_t v[256], w[256];
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 32; j++) {
            uint8_t a = ql[64 * h + j], c = ql[64 * h + 32 + j], hi = qh[32 * h + j];
            v[128 * h + j] = (uint8_t)((a & 15) | ((hi & 3) << 4));
            v[128 * h + 32 + j] = (uint8_t)((c & 15) | (((hi >> 2) & 3) << 4));
            v[128 * h + 64 + j] = (uint8_t)((a >> 4) | (((hi >> 4) & 3) << 4));
            v[128 * h + 96 + j] = (uint8_t)((c >> 4) | (((hi >> 6) & 3) << 4));
        }
    q6k_order(v, w);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 32; j++) {
            uint8_t v0 = w[128 * h + j], v1 = w[128 * h + 32 + j], v2 = w[128 * h + 64 + j], v3 = w[128 * h + 96 + j];
            r[64 * h + j] = (uint8_t)((v0 & 15) | ((v2 & 15) << 4));
            r[64 * h + 32 + j] = (uint8_t)((v1 & 15) | ((v3 & 15) << 4));
            r[128 + 32 * h + j] = (uint8_t)((v0 >> 4) | ((v1 >> 4) << 2) | ((v2 >> 4) << 4) | ((v3 >> 4) << 6));
        }
    memcpy(r + 192, b + 192, 16);
    float d = f16_to_f32(b + 208);
    memcpy(r + 208, &d, 4);
}

/* Blocks [first, first + count) of GGUF Q4_K (type 12) or Q6_K (type 14) data as records.  0, or -1: another type */
int specviz_records(const uint8_t *blocks, int type, int64_t first, int64_t count, uint8_t *out) {
    if (type == 12) {
        for (int64_t i = first; i < first + count; i++) q4k_record(blocks + i * Q4K_BLOCK, out + i * Q4K_REC);
    } else if (type == 14) {
        for (int64_t i = first; i < first + count; i++) q6k_record(blocks + i * Q6K_BLOCK, out + i * Q6K_REC);
    } else {
        return -1;
    }
    return 0;
}

static float six_bits(float value, float unit) {
    if (!(unit > 0)) return 0.0f;
    float q = nearbyintf(value / (unit > 1e-30f ? unit : 1e-30f));
    return q < 0 ? 0.0f : (q > 63 ? 63.0f : q);
}

/* Rows [first, first + count) of float32 w [n, k] as Q4_K records [n, ceil(k / 256), 152]: q4k.quantize's
 * values (the last block of a row zero-padded). */
void specviz_quantize_q4k(const float *w, int64_t k, int64_t first, int64_t count, uint8_t *out) {
    const int64_t kb = (k + 255) / 256;
    float x[256];
    uint8_t q[256], stored[256];
    for (int64_t n = first; n < first + count; n++) {
        for (int64_t b = 0; b < kb; b++) {
            const int64_t start = b * 256, have = k - start < 256 ? k - start : 256;
            memcpy(x, w + n * k + start, (size_t)have * 4);
            for (int64_t i = have; i < 256; i++) x[i] = 0.0f;
            float step_f[8], min_f[8], d = 0, dmin = 0;
            for (int s = 0; s < 8; s++) {
                float lo = x[32 * s], hi = x[32 * s];
                for (int j = 1; j < 32; j++) {
                    lo = x[32 * s + j] < lo ? x[32 * s + j] : lo;
                    hi = x[32 * s + j] > hi ? x[32 * s + j] : hi;
                }
                lo = lo > 0 ? 0.0f : lo;
                step_f[s] = (hi - lo) / 15.0f;
                min_f[s] = -lo;
                if (s == 0 || step_f[s] > d) d = step_f[s];
                if (s == 0 || min_f[s] > dmin) dmin = min_f[s];
            }
            d = d / 63.0f;
            dmin = dmin / 63.0f;
            uint8_t *r = out + (n * kb + b) * Q4K_REC;
            for (int s = 0; s < 8; s++) {
                float sc = six_bits(step_f[s], d), mn = six_bits(min_f[s], dmin);
                float step = d * sc, offset = dmin * mn;
                for (int j = 0; j < 32; j++) {
                    float v = 0.0f;
                    if (step > 0) {
                        v = nearbyintf((x[32 * s + j] + offset) / (step > 1e-30f ? step : 1e-30f));
                        v = v < 0 ? 0.0f : (v > 15 ? 15.0f : v);
                    }
                    q[32 * s + j] = (uint8_t)v;
                }
                r[128 + s] = (uint8_t)sc;
                r[136 + s] = (uint8_t)mn;
            }
            q4k_order(q, stored);
            pack4(stored, r);
            memcpy(r + 144, &d, 4);
            memcpy(r + 148, &dmin, 4);
        }
    }
}
