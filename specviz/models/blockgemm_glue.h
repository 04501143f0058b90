/* blockgemm_glue.h: the rest of a decoder layer for the models that run on blockgemm (included by blockgemm.c): RMSNorm,
   rotary embedding and the SiLU gate, each one call where transformers' expressions take 5 to 12 torch ops (about
   5 ms of a 36 ms step of the Qwen 1.5B went to those ops' calls, not to their arithmetic). Each row is computed
   alone by the same instructions whatever the rows beside it, with no fused multiply-adds, so a row's bits never
   depend on how many share the call. The arithmetic is transformers' own expression, in its order (the norm's
   sum of squares excepted: a 16-lane sum folded 8+8, 4+4, 2+2, 1+1). */

/* out (M, n) = w * (x * (1 / sqrt(mean(x^2) + eps))) row by row (Qwen2RMSNorm / LlamaRMSNorm); n a multiple of 16 */
int blockgemm_rms_norm(const float *x, int64_t M, int64_t n, const float *w, float eps, float *out) {
    if (n % 16 || M < 1) return -1;
    for (int64_t r = 0; r < M; r++) {
        const float *xr = x + r * n;
        float lane[16] = {0};
        for (int64_t i = 0; i < n; i += 16)
            for (int t = 0; t < 16; t++) lane[t] = lane[t] + xr[i + t] * xr[i + t];
        for (int s = 8; s >= 1; s /= 2)
            for (int t = 0; t < s; t++) lane[t] = lane[t] + lane[t + s];
        float inv = 1.0f / sqrtf(lane[0] / (float)n + eps);
        for (int64_t i = 0; i < n; i++) out[r * n + i] = w[i] * (xr[i] * inv);
    }
    return 0;
}

/* x (M, heads, d) in place: x * cos + rotate_half(x) * sin, cos and sin (M, d) of each row's position
   (rotate_half: the second half negated, then the first) */
int blockgemm_rotary(float *x, int64_t M, int64_t heads, int64_t d, const float *cos, const float *sin) {
    if (d % 2 || d > 1024 || M < 1) return -1;
    const int64_t h2 = d / 2;
    for (int64_t r = 0; r < M; r++)
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + (r * heads + h) * d, a[1024];
            const float *c = cos + r * d, *s = sin + r * d;
            memcpy(a, v, sizeof(float) * (size_t)d);
            for (int64_t i = 0; i < h2; i++) v[i] = a[i] * c[i] + (-a[i + h2]) * s[i];
            for (int64_t i = h2; i < d; i++) v[i] = a[i] * c[i] + a[i - h2] * s[i];
        }
    return 0;
}

/* e^x without libm, in plain operations the compiler turns into vectors (libm's expf, called once per value, took
   5 ms of a 5-row pass): x = n ln2 + r, |r| <= ln2/2, e^r by its Taylor polynomial to r^7 / 7! (relative error
   about 1e-7), times 2^n built in the exponent bits; x is held within floats' range first, and n rounded to the
   nearest integer by adding and taking away 1.5 * 2^23 (floorf kept the loop scalar) */
static inline float glue_exp(float x) {
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    float r = (x - n * 0.693145752f) - n * 1.42860677e-6f; /* ln 2 in two parts: n ln2 exact to the last bits */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

/* out (M, n) = silu(g) * u, silu(g) = g / (1 + e^-g); g and u rows `ld` apart (a fused call's output) */
int blockgemm_silu_mul(const float *restrict g, const float *restrict u, int64_t M, int64_t n, int64_t ld,
                       float *restrict out) {
    if (M < 1) return -1;
    for (int64_t r = 0; r < M; r++) {
        const float *gr = g + r * ld, *ur = u + r * ld;
        float *o = out + r * n;
        for (int64_t i = 0; i < n; i++) o[i] = (gr[i] / (1.0f + glue_exp(-gr[i]))) * ur[i];
    }
    return 0;
}
