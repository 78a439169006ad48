/* GGUF blocks dequantized to gguf-py's float32 values, bit for bit (specviz/models/gguf_dequant.py).
 *
 * The arithmetic is gguf-py's (gguf/quants.py), in its order and in float32: a Q4_K value is
 * (d * sc) * q - dmin * m, a Q6_K value (d * sc) * q, a Q8_0 / Q5_0 value d * q.  Compiled with
 * -ffp-contract=off, so no multiply-add is fused (a fused one rounds once where numpy rounds twice).
 * Each value is then written as float32, as bfloat16 (torch's rounding: to nearest, ties to even; NaN
 * kept a NaN) or as float32 holding that bfloat16 value (what a converted cache's weight is once widened).
 *
 * Plain C, no torch headers: it compiles in well under a second, where the first start is waiting for it.
 */
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
