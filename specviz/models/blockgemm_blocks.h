/* blockgemm_blocks.h: ggml's block layouts read in plain C, included by blockgemm.c (one translation unit).
   f16 (exact half to float), and unpack_block: a block's integers, sub-block scales, offsets and float scales,
   what the portable path computes with and what blockgemm_rows dequantizes. */
/* IEEE half to float, exact (every half is a float); the same function on every path */
static float f16(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | (man << 13);
    else if (exp) bits = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) bits = sign;
    else { /* subnormal: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* ---------------------------------------------------------------------------------------------------------------
   A block unpacked (the portable path and the rows' dequantization): for its BS weights
     w[i]      the i-th weight's integer (unsigned, or signed for Q8_0)
     s[j]      the scale of weights 2j and 2j+1 (K types only; int16)
     oi[g]     integer offset per 16 weights, times that group's activation sum, added to the block's integer
     om[g]     the same for the min, whose float scale is gw
     fw, gw    the block's float scales: weight_i = fw * (s_i * w_i + oi_g) + gw * om_g
   -------------------------------------------------------------------------------------------------------------- */
static void k_scale_min(const uint8_t *q, int j, int *sc, int *m) {
    /* Q4_K / Q5_K: 8 six-bit scales and mins packed in 12 bytes */
    if (j < 4) { *sc = q[j] & 63; *m = q[j + 4] & 63; }
    else { *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}

static void unpack_block(int type, const uint8_t *x, uint8_t *w, int16_t *s, int16_t *oi, int16_t *om, float *fw, float *gw) {
    switch (type) {
    case Q4_0: case Q4_1: {
        const uint8_t *qs = x + (type == Q4_0 ? 2 : 4);
        for (int i = 0; i < 16; i++) { w[i] = qs[i] & 0xF; w[i + 16] = qs[i] >> 4; }
        *fw = f16(x);
        if (type == Q4_0) { oi[0] = oi[1] = -8; om[0] = om[1] = 0; *gw = 0.0f; }
        else { oi[0] = oi[1] = 0; om[0] = om[1] = 1; *gw = f16(x + 2); }
        break;
    }
    case Q5_0: case Q5_1: {
        int off = type == Q5_0 ? 2 : 4;
        uint32_t qh = (uint32_t)x[off] | ((uint32_t)x[off + 1] << 8) | ((uint32_t)x[off + 2] << 16) | ((uint32_t)x[off + 3] << 24);
        const uint8_t *qs = x + off + 4;
        for (int i = 0; i < 16; i++) {
            w[i] = (uint8_t)((qs[i] & 0xF) | (((qh >> i) & 1) << 4));
            w[i + 16] = (uint8_t)((qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4));
        }
        *fw = f16(x);
        if (type == Q5_0) { oi[0] = oi[1] = -16; om[0] = om[1] = 0; *gw = 0.0f; }
        else { oi[0] = oi[1] = 0; om[0] = om[1] = 1; *gw = f16(x + 2); }
        break;
    }
    case Q8_0:
        memcpy(w, x + 2, 32); /* signed: the dot takes them as int8 */
        *fw = f16(x);
        oi[0] = oi[1] = om[0] = om[1] = 0;
        *gw = 0.0f;
        break;
    case Q4_K: case Q5_K: {
        const uint8_t *scales = x + 4, *qh = x + 16, *qs = x + (type == Q4_K ? 16 : 48);
        for (int c = 0; c < 4; c++) { /* 64 weights: sub-block 2c from the low nibbles, 2c+1 from the high */
            int sc1, m1, sc2, m2;
            k_scale_min(scales, 2 * c, &sc1, &m1);
            k_scale_min(scales, 2 * c + 1, &sc2, &m2);
            for (int l = 0; l < 32; l++) {
                uint8_t lo = qs[32 * c + l] & 0xF, hi = qs[32 * c + l] >> 4;
                if (type == Q5_K) {
                    lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                    hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                }
                w[64 * c + l] = lo;
                w[64 * c + 32 + l] = hi;
            }
            for (int j = 0; j < 16; j++) { s[32 * c + j] = (int16_t)sc1; s[32 * c + 16 + j] = (int16_t)sc2; }
            oi[4 * c] = oi[4 * c + 1] = oi[4 * c + 2] = oi[4 * c + 3] = 0;
            om[4 * c] = om[4 * c + 1] = (int16_t)m1;
            om[4 * c + 2] = om[4 * c + 3] = (int16_t)m2;
        }
        *fw = f16(x);
        *gw = -f16(x + 2);
        break;
    }
    case Q6_K: {
        const uint8_t *ql = x, *qh = x + 128;
        const int8_t *sc = (const int8_t *)(x + 192);
        for (int h = 0; h < 2; h++) { /* two halves of 128 weights */
            const uint8_t *l0 = ql + 64 * h, *h0 = qh + 32 * h;
            uint8_t *o = w + 128 * h;
            for (int l = 0; l < 32; l++) {
                o[l] = (uint8_t)((l0[l] & 0xF) | ((h0[l] & 3) << 4));
                o[l + 32] = (uint8_t)((l0[l + 32] & 0xF) | (((h0[l] >> 2) & 3) << 4));
                o[l + 64] = (uint8_t)((l0[l] >> 4) | (((h0[l] >> 4) & 3) << 4));
                o[l + 96] = (uint8_t)((l0[l + 32] >> 4) | (((h0[l] >> 6) & 3) << 4));
            }
        }
        for (int g = 0; g < 16; g++) { /* the scale of natural 16-group g is sc[g] */
            for (int j = 0; j < 8; j++) s[8 * g + j] = sc[g];
            oi[g] = (int16_t)(-32 * sc[g]);
            om[g] = 0;
        }
        *fw = f16(x + 208);
        *gw = 0.0f;
        break;
    }
    default: break;
    }
}

