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

/* out (M, n) = silu(g) * u, silu(g) = g / (1 + exp(-g)); g and u rows `ld` apart (a fused call's output) */
int blockgemm_silu_mul(const float *g, const float *u, int64_t M, int64_t n, int64_t ld, float *out) {
    if (M < 1) return -1;
    for (int64_t r = 0; r < M; r++)
        for (int64_t i = 0; i < n; i++) {
            float a = g[r * ld + i];
            out[r * n + i] = (a / (1.0f + expf(-a))) * u[r * ld + i];
        }
    return 0;
}
