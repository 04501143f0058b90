/* blockgemm_attend.h: attention for the models that run on blockgemm, included by blockgemm.c. Each query row and
   head is computed alone, by the same instructions whatever rows share the call: its keys in position order, its
   scores, their softmax and the weighted values. So a row checked inside a pass of 5 or 16 gets exactly the bits of
   the one-token step that would have produced it (torch's sdpa does not promise that: see core/attend.py), in one
   call for all rows where core.attend otherwise calls sdpa once per row.

   The float order, per row r and head h: each score is a 16-lane sum over the head's width, folded 8+8, 4+4, 2+2,
   1+1, times `scaling`; e_j = expf(s_j - max); sum and out accumulate over the seen keys in position order; out is
   then multiplied by 1/sum. No fused multiply-adds (the build's -ffp-contract=off), so every path rounds alike. */

static float attend_score(const float *q, const float *k, int64_t d, float scaling) {
    float lane[16] = {0};
    for (int64_t i = 0; i < d; i += 16)
        for (int t = 0; t < 16; t++) lane[t] = lane[t] + q[i + t] * k[i + t];
    for (int w = 8; w >= 1; w /= 2)
        for (int t = 0; t < w; t++) lane[t] = lane[t] + lane[t + w];
    return lane[0] * scaling;
}

/* q (H, n, d); k, v (G, kv, d), G the kv heads (head h reads kv head h / (H / G)); `seen` (n, kv) bytes, 1 where the
   row sees that key, or NULL: row r sees keys 0 .. kv - n + r (causal after the cache); out (n, H, d).
   0, or -1 for a width that is not a multiple of 16, a row that sees no key, or no memory */
int blockgemm_attend(const float *q, int64_t H, int64_t n, int64_t d, const float *k, const float *v, int64_t G,
                     int64_t kv, const uint8_t *seen, float scaling, float *out) {
    if (d % 16 || G < 1 || H % G || n < 1 || kv < n) return -1;
    int failed = 0;
#pragma omp parallel
    {
        float *s = malloc(sizeof(float) * (size_t)kv);
        if (!s) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static) collapse(2)
        for (int64_t r = 0; r < n; r++)
            for (int64_t h = 0; h < H; h++) {
                if (!s) continue;
                const float *qr = q + (h * n + r) * d, *kg = k + (h / (H / G)) * kv * d, *vg = v + (h / (H / G)) * kv * d;
                const uint8_t *row = seen ? seen + r * kv : NULL;
                const int64_t last = kv - n + r;
                float m = -INFINITY, sum = 0.0f, *o = out + (r * H + h) * d;
                int any = 0;
                for (int64_t j = 0; j < kv; j++) {
                    if (row ? !row[j] : j > last) continue;
                    s[j] = attend_score(qr, kg + j * d, d, scaling);
                    if (!any || s[j] > m) m = s[j];
                    any = 1;
                }
                if (!any) {
#pragma omp atomic write
                    failed = 1;
                    continue;
                }
                memset(o, 0, sizeof(float) * (size_t)d);
                for (int64_t j = 0; j < kv; j++) {
                    if (row ? !row[j] : j > last) continue;
                    float e = expf(s[j] - m);
                    sum = sum + e;
                    const float *vj = vg + j * d;
                    for (int64_t i = 0; i < d; i++) o[i] = o[i] + e * vj[i];
                }
                float inv = 1.0f / sum;
                for (int64_t i = 0; i < d; i++) o[i] = o[i] * inv;
            }
        free(s);
    }
    return failed ? -1 : 0;
}
