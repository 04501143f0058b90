/* blockgemm_rows.h: a matrix's rows as floats (gguf's dequantization, bit for bit) and as Q4_0 blocks again (gguf's
   Q4_0 quantization of those floats, bit for bit), included by blockgemm.c. The second is how a draft whose file
   holds 5.5 to 8.5 bits a weight is read at 4.5: a draft's precision changes how often it guesses right, never the
   output, and a step reads every byte of it. */

/* one row's K weights as floats: each is (fw * (s * w + oi)) + gw * om, the grouping gguf's dequantization uses */
static void row_floats(int type, const uint8_t *row, int64_t K, float *o) {
    int bs = blockgemm_block_size(type);
    uint8_t w[256];
    int16_t s[128], oi[16], om[16];
    float fw, gw;
    for (int64_t b = 0; b < K / bs; b++) {
        unpack_block(type, row + b * blockgemm_block_bytes(type), w, s, oi, om, &fw, &gw);
        for (int i = 0; i < bs; i++) {
            int g = i / 16;
            float v;
            if (bs == 256) { /* d * sc as one float, times q, then the min: (d*sc)*q - dmin*m */
                float scale = fw * (float)s[i / 2];
                int q = w[i];
                v = scale * (float)q;
                if (om[g]) v = v + gw * (float)om[g];
                else if (oi[g]) v = scale * (float)(q - 32); /* Q6_K: d*sc*(q-32) */
            } else {
                int q = type == Q8_0 ? (int8_t)w[i] : w[i] + oi[g];
                v = fw * (float)q;
                if (om[g]) v = v + gw;
            }
            o[b * bs + i] = v;
        }
    }
}

static int rows_shape_ok(int type, int64_t row_bytes, int64_t K) {
    int bs = blockgemm_block_size(type);
    return bs && K % bs == 0 && row_bytes == K / bs * blockgemm_block_bytes(type);
}

/* The weights of some rows as floats (the embedding's rows for a few ids): out (len(ids), K) */
int blockgemm_rows(int type, const uint8_t *W, int64_t row_bytes, int64_t K, const int64_t *ids, int64_t n_ids, float *out) {
    if (!rows_shape_ok(type, row_bytes, K)) return -1;
    for (int64_t r = 0; r < n_ids; r++) row_floats(type, W + ids[r] * row_bytes, K, out + r * K);
    return 0;
}

/* float to fp16 bits, rounded to nearest even as numpy's astype(float16) does (F. Giesen's branch form) */
static uint16_t to_f16(float f) {
    const uint32_t f32_inf = 255u << 23, f16_max = (127u + 16u) << 23, magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = x & 0x80000000u;
    x ^= sign;
    uint16_t o;
    if (x >= f16_max) o = x > f32_inf ? 0x7E00 : 0x7C00; /* nan, or too large: inf */
    else if (x < (113u << 23)) {                        /* a subnormal half: the float adds rounds it */
        float fx, m;
        memcpy(&fx, &x, 4);
        memcpy(&m, &magic, 4);
        fx = fx + m;
        uint32_t r;
        memcpy(&r, &fx, 4);
        o = (uint16_t)(r - magic);
    } else {
        uint32_t odd = (x >> 13) & 1;
        x += ((uint32_t)(15 - 127) << 23) + 0xFFF + odd;
        o = (uint16_t)(x >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

/* 32 floats as one Q4_0 block, gguf's Q4_0.quantize_blocks: the largest magnitude m (its sign kept, the first of a
   tie) gives d = m / -8, and each value q = min(15, trunc(x * (1/d) + 8.5)); d kept as fp16 */
static void q4_0_block(const float *x, uint8_t *o) {
    float amax = fabsf(x[0]), max = x[0]; /* numpy's argmax: the first; an all-zero block's d keeps x[0]'s sign */
    for (int i = 1; i < 32; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
    float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    uint16_t h = to_f16(d);
    memcpy(o, &h, 2);
    for (int i = 0; i < 16; i++) {
        float a = truncf(x[i] * id + 8.5f), b = truncf(x[i + 16] * id + 8.5f);
        uint8_t qa = (uint8_t)(a > 15.0f ? 15 : a), qb = (uint8_t)(b > 15.0f ? 15 : b);
        o[2 + i] = (uint8_t)(qa | (qb << 4));
    }
}

/* rows (n, K) of `type` as Q4_0: out (n, K/32 * 18); 0, or -1 for a shape or type it cannot read */
int blockgemm_requantize_q4_0(int type, const uint8_t *W, int64_t row_bytes, int64_t n, int64_t K, uint8_t *out) {
    if (!rows_shape_ok(type, row_bytes, K) || K % 32) return -1;
    int failed = 0;
#pragma omp parallel
    {
        float *x = malloc(sizeof(float) * (size_t)K);
        if (!x) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < n; r++) {
            if (!x) continue;
            row_floats(type, W + r * row_bytes, K, x);
            for (int64_t b = 0; b < K / 32; b++) q4_0_block(x + 32 * b, out + r * (K / 32 * 18) + 18 * b);
        }
        free(x);
    }
    return failed ? -1 : 0;
}
