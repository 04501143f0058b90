/* blockgemm_x16.h: matrices repacked 16 output rows side by side, included by blockgemm.c: the K types Q4_K and
   Q6_K (256-blocks, below), and the 32-blocks Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (x32_*, at the end).

   Why: with one output row at a time, every 256-weight block of every row ends in a horizontal fold of its lanes
   and a float multiply-add; side by side, one vector holds the same k-quad of 16 rows, an activation's 4 bytes are
   broadcast against it (dpbusd: 4 products summed per output), a sub-block's integer is one vector, its scale one
   multiply, and the block's float terms are computed for 16 outputs at once. Each output keeps its own lane from
   start to end, so nothing is reduced across lanes and a row's bits cannot depend on any other row.

   Layout, per group of 16 rows and per 256-block (the groups' blocks in k order, so a thread streams its rows):
     nib[32][64]  values' low 4 bits: chunk c holds quads 2c (low nibbles) and 2c+1 (high), byte 4*row + i = k 4q+i
     hi2[16][64]  Q6_K only: values' top 2 bits, chunk t holds quads 4t..4t+3 at bits 2s, 2s+1 (s = quad - 4t)
     sc[G][16]    each sub-block's scale per row (Q4_K: 8 of 32 values, u8; Q6_K: 16 of 16, i8)
     mn[4][16][2] Q4_K only: mins of sub-blocks 2p, 2p+1 per row, int16 pairs
     fw[16], gw[16]  d, and -dmin (Q4_K), as fp16 bits (gw only where the type has a min)
   The float order per output and activation row: acc = 0; per block acc = acc + ((fw*da)*is [+ (gw*da)*im, types with
   a min]); then
   + bias, with is the block's exact integer (Σ_j sc_j Σ values*acts, Q6_K's values less 32) and im = Σ_j m_j bsum_j. */

/* At a block's start all its lines are asked for at once (prefetch, distance 0 blocks): the misses then overlap one
   another and the block's arithmetic, where the loads inside the arithmetic came one after another. Measured on a Zen 4
   over 200 MB of Q4_K (out of cache): 5 rows cost 1.1-1.4x one row this way, 2.2x with the prefetch 1 to 3 blocks ahead
   and 2.4x with none (benchmarks/gguf-precision.md). -DX16_AHEAD=n moves it n blocks ahead, -1 turns it off. */
#ifndef X16_AHEAD
#define X16_AHEAD 0
#endif
#ifndef X16_HINT
#define X16_HINT 0
#endif
/* Threads take the groups of 16 rows X16_CHUNK at a time as they come free (a core that the browser or another
   program holds for a moment then costs its share, not the whole call: with halves fixed in advance, a step of the
   Qwen 1.5B spread 2.5x between its quartiles beside a browser on the same two cores). A group is computed by one
   thread, the same way on any: the same bits. */
#ifndef X16_CHUNK
#define X16_CHUNK 8
#endif

/* a block's lines (gb bytes at o), all asked for at once (or X16_AHEAD blocks ahead) */
static inline void x16_ask(const uint8_t *o, int64_t gb) {
    if (X16_AHEAD >= 0)
        for (int64_t c = 0; c < gb; c += 64) __builtin_prefetch(o + X16_AHEAD * gb + c, 0, X16_HINT);
}

#if defined(USE512)
/* acc + the 4 products of each of 16 rows' bytes in V with the 4 activation bytes at p (u8 x s8, summed per row) */
static inline __m512i x16_dot(__m512i acc, __m512i v, const int8_t *p) {
    int32_t four;
    memcpy(&four, p, 4);
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, v, _mm512_set1_epi32(four));
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(v, _mm512_set1_epi32(four)), _mm512_set1_epi16(1)));
#endif
}
#endif

static int x32_block_bytes(int type);

/* the float scales at a block's end: 16 rows' d as the file's fp16 bits, then (types with a min) their min, as fp16
   (Q4_K: -dmin, the sign bit flipped: exact); read back as floats, exactly */
static int x16_has_min(int type) { return type == Q4_K || type == Q4_1 || type == Q5_1; }
static int x16_tail(int type) { return x16_has_min(type) ? 64 : 32; }

static void x16_keep_scales(int type, const uint8_t *block, uint8_t *tail, int r) {
    int d_at = type == Q6_K ? 208 : 0;
    tail[2 * r] = block[d_at];
    tail[2 * r + 1] = block[d_at + 1];
    if (x16_has_min(type)) {
        tail[32 + 2 * r] = block[2];
        tail[32 + 2 * r + 1] = (uint8_t)(block[3] ^ (type == Q4_K ? 0x80 : 0)); /* Q4_K's weight is d*sc*q - dmin*m */
    }
}

#if !defined(USE512) /* the AVX2 and portable paths' pieces (AVX-512 runs x16_linear_regs, at the end) */
/* one block's float terms for one activation row, 16 outputs: out += (d*da)*is [+ (m*da)*im, types with a min] */
static inline void x16_fold(const uint8_t *tail, int with_min, float da, const int32_t *is, const int32_t *im,
                            float *out) {
#if defined(USE256)
    for (int h = 0; h < 2; h++) {
        __m256 t = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tail + 16 * h))),
                                               _mm256_set1_ps(da)),
                                 _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(is + 8 * h))));
        if (with_min)
            t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tail + 32 + 16 * h))),
                                                             _mm256_set1_ps(da)),
                                               _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(im + 8 * h)))));
        _mm256_storeu_ps(out + 8 * h, _mm256_add_ps(_mm256_loadu_ps(out + 8 * h), t));
    }
#else
    for (int t = 0; t < 16; t++) {
        float v = (f16(tail + 2 * t) * da) * (float)is[t];
        if (with_min) v = v + (f16(tail + 32 + 2 * t) * da) * (float)im[t];
        out[t] = out[t] + v;
    }
#endif
}
#endif

static int x16_block_bytes(int type) {
    return type == Q4_K ? 2048 + 128 + 256 + 64 : type == Q6_K ? 2048 + 1024 + 256 + 32 : x32_block_bytes(type);
}

int64_t blockgemm_x16_size(int type, int64_t n, int64_t k) {
    int bs = blockgemm_block_size(type);
    if (!x16_block_bytes(type) || n % 16 || k % bs) return 0;
    return n / 16 * (k / bs) * x16_block_bytes(type);
}

static void x32_place(int type, uint8_t *o, int r, const uint8_t *w);

/* one row's unpacked K block into its group's block: the values' nibbles (and Q6_K's top bits), the scales, the mins */
static void x16_place_k(int type, uint8_t *o, int r, const uint8_t *w, const int16_t *s, const int16_t *om) {
    uint8_t *nib = o, *hi2 = o + 2048, *sc = o + (type == Q6_K ? 3072 : 2048);
    int16_t *mn = (int16_t *)(o + 2048 + 128);
    /* four bytes at a time (a quad's 4 values are one little-endian word): the load's repacking, 256 byte updates a block
       and row before, took 5 s of a Qwen 1.5B start */
    for (int c = 0; c < 32; c++) { /* chunk c: quad 2c's low nibbles, quad 2c+1's as the high ones */
        uint32_t a, b;
        memcpy(&a, w + 8 * c, 4);
        memcpy(&b, w + 8 * c + 4, 4);
        uint32_t v = (a & 0x0F0F0F0Fu) | ((b & 0x0F0F0F0Fu) << 4);
        memcpy(nib + c * 64 + 4 * r, &v, 4);
    }
    if (type == Q6_K)
        for (int t = 0; t < 16; t++) { /* chunk t: quads 4t..4t+3's top 2 bits (values < 64) at bits 2s, 2s+1 */
            uint32_t v = 0;
            for (int s2 = 0; s2 < 4; s2++) {
                uint32_t a;
                memcpy(&a, w + 16 * t + 4 * s2, 4);
                v |= ((a >> 4) & 0x03030303u) << (2 * s2); /* a byte's bits 4-5: the next byte's low bits are masked */
            }
            memcpy(hi2 + t * 64 + 4 * r, &v, 4);
        }
    if (type == Q4_K)
        for (int j = 0; j < 8; j++) {
            sc[j * 16 + r] = (uint8_t)s[16 * j];
            mn[((j / 2) * 16 + r) * 2 + j % 2] = om[2 * j];
        }
    else
        for (int j = 0; j < 16; j++) sc[j * 16 + r] = (uint8_t)(int8_t)s[8 * j];
}

/* the file's rows (n, row_bytes) into the side-by-side layout: each row's block unpacked as the portable path reads
   it, placed beside its group's other 15, its float scales kept; 0, or -1 where the type or shape has none */
int blockgemm_repack_x16(int type, const uint8_t *W, int64_t row_bytes, int64_t n, int64_t k, uint8_t *out) {
    int bs = blockgemm_block_size(type), bb = blockgemm_block_bytes(type);
    if (!blockgemm_x16_size(type, n, k) || row_bytes != k / bs * bb) return -1;
    int64_t nb = k / bs, gb = x16_block_bytes(type);
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < n / 16; g++) {
        uint8_t w[256];
        int16_t s[128], oi[16], om[16];
        float fw, gw;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = out + (g * nb + b) * gb;
            memset(o, 0, (size_t)(gb - x16_tail(type)));
            for (int r = 0; r < 16; r++) {
                const uint8_t *x = W + (g * 16 + r) * row_bytes + b * bb;
                unpack_block(type, x, w, s, oi, om, &fw, &gw);
                if (bs == 256) x16_place_k(type, o, r, w, s, om);
                else x32_place(type, o, r, w);
                x16_keep_scales(type, x, o + gb - x16_tail(type), r);
            }
        }
    }
    return 0;
}

#if !defined(USE512)
/* one block's value of quad q for the 16 rows, as 64 bytes (portable: the same bytes the vector paths make) */
static inline void x16_quad(int type, const uint8_t *o, int q, uint8_t *v) {
    const uint8_t *nib = o + (q / 2) * 64, *hi2 = o + 2048 + (q / 4) * 64;
    for (int t = 0; t < 64; t++) {
        uint8_t x = (uint8_t)((nib[t] >> (4 * (q % 2))) & 0xF);
        if (type == Q6_K) x |= (uint8_t)(((hi2[t] >> (2 * (q % 4))) & 3) << 4);
        v[t] = x;
    }
}

/* the block's integers for every activation row, 16 outputs each: is (M, 16) = Σ_j sc_j Σ values*acts (Q6_K's values
   less 32), im (M, 16) = Σ_j m_j bsum_j (Q4_K); each sub-block's values unpacked once for all rows */
static inline __attribute__((always_inline)) void x16_block_of(int type, int groups, int quads, const uint8_t *o,
                                                                const Acts *acts, int64_t M, int64_t K, int64_t b,
                                                                int32_t *is, int32_t *im) {
    const uint8_t *sc = o + (type == Q6_K ? 3072 : 2048);
    const int16_t *mn = (const int16_t *)(o + 2048 + 128);
    memset(is, 0, sizeof(int32_t) * 16 * (size_t)M);
    memset(im, 0, sizeof(int32_t) * 16 * (size_t)M);
    for (int j = 0; j < groups; j++) {
        uint8_t v[8][64];
        for (int qq = 0; qq < quads; qq++) x16_quad(type, o, j * quads + qq, v[qq]);
        for (int64_t r = 0; r < M; r++) {
            const int8_t *a = acts->q + r * K + b * 256 + 4 * j * quads;
            int32_t S[16] = {0};
            for (int qq = 0; qq < quads; qq++)
                for (int t = 0; t < 64; t++) S[t / 4] += (int32_t)v[qq][t] * a[4 * qq + t % 4];
            for (int t = 0; t < 16; t++) {
                int32_t scale = type == Q6_K ? (int32_t)(int8_t)sc[16 * j + t] : (int32_t)sc[16 * j + t];
                int32_t off = type == Q6_K ? 32 * (int32_t)acts->sum[r * (K / 16) + b * 16 + j] : 0;
                is[16 * r + t] += (S[t] - off) * scale;
            }
        }
    }
    if (type == Q4_K)
        for (int64_t r = 0; r < M; r++) { /* mins of sub-blocks against their activations' sums (of 32) */
            const int16_t *sum = acts->sum + r * (K / 16) + b * 16;
            for (int j = 0; j < 8; j++)
                for (int t = 0; t < 16; t++)
                    im[16 * r + t] += (int32_t)mn[((j / 2) * 16 + t) * 2 + j % 2] * (sum[2 * j] + sum[2 * j + 1]);
        }
}

/* x16_block_of with the type's shape as constants, so that its loops unroll and its values stay in registers */
static void x16_block(int type, const uint8_t *o, const Acts *acts, int64_t M, int64_t K, int64_t b, int32_t *is,
                      int32_t *im) {
    if (type == Q6_K) x16_block_of(Q6_K, 16, 4, o, acts, M, K, b, is, im);
    else x16_block_of(Q4_K, 8, 8, o, acts, M, K, b, is, im);
}

static void x32_block(int type, const uint8_t *o, const Acts *acts, int64_t M, int64_t K, int64_t b, int32_t *is,
                      int32_t *im);

/* y (M, ldy) = x @ W.T + bias, W repacked (n rows); threads take the groups of 16 rows X16_CHUNK at a time */
static int x16_linear(int type, const uint8_t *X, int64_t n, int64_t nb, const Acts *acts, int64_t M, int64_t K,
                      const float *bias, float *y, int64_t ldy) {
    int64_t gb = x16_block_bytes(type);
    int failed = 0;
#pragma omp parallel
    {
        float *acc = malloc(sizeof(float) * 16 * (size_t)M);
        int32_t *is = malloc(sizeof(int32_t) * 16 * (size_t)M), *im = malloc(sizeof(int32_t) * 16 * (size_t)M);
        if (!acc || !is || !im) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, X16_CHUNK)
        for (int64_t g = 0; g < n / 16; g++) {
            if (!acc || !is || !im) continue;
            memset(acc, 0, sizeof(float) * 16 * (size_t)M);
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *o = X + (g * nb + b) * gb;
                const uint8_t *tail = o + gb - x16_tail(type);
                x16_ask(o, gb);
                if (blockgemm_block_size(type) == 256) x16_block(type, o, acts, M, K, b, is, im);
                else x32_block(type, o, acts, M, K, b, is, im);
                for (int64_t r = 0; r < M; r++)
                    x16_fold(tail, x16_has_min(type), acts->d[r * nb + b], is + 16 * r, im + 16 * r, acc + 16 * r);
            }
            for (int64_t r = 0; r < M; r++)
                for (int t = 0; t < 16; t++) {
                    float v = acc[16 * r + t];
                    y[r * ldy + g * 16 + t] = bias ? v + bias[g * 16 + t] : v;
                }
        }
        free(acc);
        free(is);
        free(im);
    }
    return failed ? -1 : 0;
}

#endif

/* ---------------------------------------------------------------------------------------------------------------
   The 32-blocks side by side. Per group of 16 rows and per block:
     val[8][64]  Q8_0: each value + 128 as a byte, quad q in chunk q (byte 4*row + i = k 4q+i)
     nib[4][64]  the others: values' low 4 bits, chunk c holds quads 2c (low nibbles) and 2c+1 (high)
     hb[64]      Q5_0, Q5_1: bit q of byte 4*row + i is the 5th bit of quad q's value
     fw[16], gw[16]  d and the min m (Q4_1, Q5_1 only), as fp16 bits
   Per output and activation row the block's integer is Σ stored values*acts - offset*bsum (offset 8, 16, 128 or 0)
   and im the activations' sum (types with a min); the float order is the K types' one.
   -------------------------------------------------------------------------------------------------------------- */
static int x32_block_bytes(int type) {
    switch (type) {
    case Q4_0: return 256 + 32;
    case Q4_1: return 256 + 64;
    case Q5_0: return 256 + 64 + 32;
    case Q5_1: return 256 + 64 + 64;
    case Q8_0: return 512 + 32;
    default: return 0;
    }
}

static int x32_offset(int type) { return type == Q4_0 ? 8 : type == Q5_0 ? 16 : type == Q8_0 ? 128 : 0; }

/* one row's unpacked 32-block into its group's block: Q8_0's bytes (+128), else the nibbles and Q5's fifth bits */
static void x32_place(int type, uint8_t *o, int r, const uint8_t *w) {
    for (int kk = 0; kk < 32; kk++) {
        int q = kk / 4, byte = 4 * r + kk % 4;
        if (type == Q8_0) o[q * 64 + byte] = (uint8_t)((int)(int8_t)w[kk] + 128);
        else {
            o[(q / 2) * 64 + byte] |= (uint8_t)((w[kk] & 0xF) << (4 * (q % 2)));
            if (type == Q5_0 || type == Q5_1) o[256 + byte] |= (uint8_t)(((w[kk] >> 4) & 1) << q);
        }
    }
}

#if !defined(USE512)
/* the block's integers for every activation row, 16 outputs each (is, im: (M, 16)); values unpacked once */
static void x32_block(int type, const uint8_t *o, const Acts *acts, int64_t M, int64_t K, int64_t b, int32_t *is,
                      int32_t *im) {
    int off = x32_offset(type), mins = type == Q4_1 || type == Q5_1, five = type == Q5_0 || type == Q5_1;
    uint8_t v[8][64];
    for (int q = 0; q < 8; q++)
        for (int t = 0; t < 64; t++) {
            if (type == Q8_0) { v[q][t] = o[64 * q + t]; continue; }
            uint8_t x = (uint8_t)((o[(q / 2) * 64 + t] >> (4 * (q % 2))) & 0xF);
            if (five) x |= (uint8_t)(((o[256 + t] >> q) & 1) << 4);
            v[q][t] = x;
        }
    for (int64_t r = 0; r < M; r++) {
        const int8_t *a = acts->q + r * K + b * 32;
        const int16_t *sum = acts->sum + r * (K / 16) + b * 2;
        int32_t bsum = (int32_t)sum[0] + sum[1], S[16] = {0};
        for (int q = 0; q < 8; q++)
            for (int t = 0; t < 64; t++) S[t / 4] += (int32_t)v[q][t] * a[4 * q + t % 4];
        for (int t = 0; t < 16; t++) {
            is[16 * r + t] = S[t] - off * bsum;
            im[16 * r + t] = mins ? bsum : 0;
        }
    }
}
#endif

#if defined(USE512)
/* ---------------------------------------------------------------------------------------------------------------
   The same arithmetic with up to X16_ROWS activation rows held in registers: a group's integers and float sums never
   go through memory between sub-blocks and blocks (a store read back at once stalls: it cost as much as the
   products). Each output's integer is the same exact sum and its floats are taken in the same order as above, so
   the bits are x16_linear's whatever the chunk of rows.
   -------------------------------------------------------------------------------------------------------------- */
#define X16_ROWS 8

/* a chunk's R rows of 16 outputs (+ bias) into y, rows ldy apart */
static inline __attribute__((always_inline)) void x16_store(int R, const __m512 *acc, const float *bias, float *y,
                                                             int64_t ldy) {
    for (int r = 0; r < R; r++)
        _mm512_storeu_ps(y + r * ldy, bias ? _mm512_add_ps(acc[r], _mm512_loadu_ps(bias)) : acc[r]);
}

/* the chunk's R rows of one group of 16 outputs, a K type (Q4_K, Q6_K): y rows r0.. r0+R-1 */
static inline __attribute__((always_inline)) void x16_group_k(int type, int R, const uint8_t *g0, int64_t nb,
                                                                const Acts *acts, int64_t r0, int64_t K,
                                                                const float *bias, float *y, int64_t ldy) {
    const int groups = type == Q6_K ? 16 : 8, quads = type == Q6_K ? 4 : 8;
    const int64_t gb = x16_block_bytes(type);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(3);
    __m512 acc[X16_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = g0 + b * gb, *tail = o + gb - x16_tail(type);
        const uint8_t *sc = o + (type == Q6_K ? 3072 : 2048);
        x16_ask(o, gb);
        __m512i is[X16_ROWS];
        for (int r = 0; r < R; r++) is[r] = _mm512_setzero_si512();
        for (int j = 0; j < groups; j++) {
            __m512i s[X16_ROWS];
            for (int r = 0; r < R; r++) s[r] = _mm512_setzero_si512();
            for (int qq = 0; qq < quads; qq++) {
                int q = j * quads + qq;
                __m512i v = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(o + (q / 2) * 64), 4 * (q % 2)), m4);
                if (type == Q6_K)
                    v = _mm512_or_si512(v, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(
                            _mm512_loadu_si512(o + 2048 + (q / 4) * 64), 2 * (q % 4)), m2), 4));
                for (int r = 0; r < R; r++) s[r] = x16_dot(s[r], v, acts->q + (r0 + r) * K + b * 256 + 4 * q);
            }
            __m512i scale = type == Q6_K ? _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16 * j)))
                                         : _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16 * j)));
            for (int r = 0; r < R; r++) {
                if (type == Q6_K)
                    s[r] = _mm512_sub_epi32(s[r], _mm512_set1_epi32(32 * (int32_t)acts->sum[(r0 + r) * (K / 16) + b * 16 + j]));
                is[r] = _mm512_add_epi32(is[r], _mm512_mullo_epi32(s[r], scale));
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tail));
        for (int r = 0; r < R; r++) {
            const float da = acts->d[(r0 + r) * nb + b];
            __m512 t = _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(da)), _mm512_cvtepi32_ps(is[r]));
            if (type == Q4_K) { /* the mins against the sub-blocks' activation sums, as x16_block_of takes them */
                const int16_t *mn = (const int16_t *)(o + 2048 + 128), *sum = acts->sum + (r0 + r) * (K / 16) + b * 16;
                __m512i im = _mm512_setzero_si512();
                for (int p = 0; p < 4; p++) {
                    int16_t pair[2] = {(int16_t)(sum[4 * p] + sum[4 * p + 1]), (int16_t)(sum[4 * p + 2] + sum[4 * p + 3])};
                    int32_t both;
                    memcpy(&both, pair, 4);
                    im = _mm512_add_epi32(im, _mm512_madd_epi16(_mm512_loadu_si512(mn + 32 * p), _mm512_set1_epi32(both)));
                }
                t = _mm512_add_ps(t, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tail + 32))),
                                                                 _mm512_set1_ps(da)), _mm512_cvtepi32_ps(im)));
            }
            acc[r] = _mm512_add_ps(acc[r], t);
        }
    }
    x16_store(R, acc, bias, y + r0 * ldy, ldy);
}

/* the same for the 32-blocks (x32_block's integers) */
static inline __attribute__((always_inline)) void x16_group_32(int type, int R, const uint8_t *g0, int64_t nb,
                                                                 const Acts *acts, int64_t r0, int64_t K,
                                                                 const float *bias, float *y, int64_t ldy) {
    const int off = x32_offset(type), mins = type == Q4_1 || type == Q5_1, five = type == Q5_0 || type == Q5_1;
    const int64_t gb = x16_block_bytes(type);
    const __m512i m4 = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);
    __m512 acc[X16_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = g0 + b * gb, *tail = o + gb - x16_tail(type);
        x16_ask(o, gb);
        __m512i s[X16_ROWS];
        for (int r = 0; r < R; r++) s[r] = _mm512_setzero_si512();
        for (int q = 0; q < 8; q++) {
            __m512i v;
            if (type == Q8_0) v = _mm512_loadu_si512(o + 64 * q);
            else {
                v = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(o + (q / 2) * 64), 4 * (q % 2)), m4);
                if (five)
                    v = _mm512_or_si512(v, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(o + 256), q), one), 4));
            }
            for (int r = 0; r < R; r++) {
                const int8_t *a = acts->q + (r0 + r) * K + b * 32 + 4 * q;
#if !defined(__AVX512VNNI__)
                if (type == Q8_0) { /* bytes up to 255 would overflow maddubs' int16 pairs: the nibble halves apart */
                    __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    s[r] = _mm512_add_epi32(x16_dot(s[r], lo, a), _mm512_slli_epi32(x16_dot(_mm512_setzero_si512(), hi, a), 4));
                    continue;
                }
#endif
                s[r] = x16_dot(s[r], v, a);
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tail));
        for (int r = 0; r < R; r++) {
            const int16_t *sum = acts->sum + (r0 + r) * (K / 16) + b * 2;
            const int32_t bsum = (int32_t)sum[0] + sum[1];
            const float da = acts->d[(r0 + r) * nb + b];
            __m512i is = _mm512_sub_epi32(s[r], _mm512_set1_epi32(off * bsum));
            __m512 t = _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(da)), _mm512_cvtepi32_ps(is));
            if (mins)
                t = _mm512_add_ps(t, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tail + 32))),
                                                                 _mm512_set1_ps(da)), _mm512_cvtepi32_ps(_mm512_set1_epi32(bsum))));
            acc[r] = _mm512_add_ps(acc[r], t);
        }
    }
    x16_store(R, acc, bias, y + r0 * ldy, ldy);
}

#define X16_CASE(T, F, N) case N: F(T, N, g0, nb, acts, r0, K, bias, y, ldy); break;
#define X16_CASES(T, F) switch (R) { X16_CASE(T, F, 1) X16_CASE(T, F, 2) X16_CASE(T, F, 3) X16_CASE(T, F, 4) \
                                     X16_CASE(T, F, 5) X16_CASE(T, F, 6) X16_CASE(T, F, 7) X16_CASE(T, F, 8) }

/* one group's chunk of R ≤ X16_ROWS rows, the type and R as constants (so that the arrays above are registers) */
static void x16_group(int type, int R, const uint8_t *g0, int64_t nb, const Acts *acts, int64_t r0, int64_t K,
                      const float *bias, float *y, int64_t ldy) {
    switch (type) {
    case Q4_K: X16_CASES(Q4_K, x16_group_k) break;
    case Q6_K: X16_CASES(Q6_K, x16_group_k) break;
    case Q4_0: X16_CASES(Q4_0, x16_group_32) break;
    case Q4_1: X16_CASES(Q4_1, x16_group_32) break;
    case Q5_0: X16_CASES(Q5_0, x16_group_32) break;
    case Q5_1: X16_CASES(Q5_1, x16_group_32) break;
    case Q8_0: X16_CASES(Q8_0, x16_group_32) break;
    }
}

/* x16_linear's result: threads take the groups X16_CHUNK at a time as they come free, each group's activation rows
   X16_ROWS at a time */
static int x16_linear_regs(int type, const uint8_t *X, int64_t n, int64_t nb, const Acts *acts, int64_t M, int64_t K,
                           const float *bias, float *y, int64_t ldy) {
    int64_t gb = x16_block_bytes(type);
#pragma omp parallel for schedule(dynamic, X16_CHUNK)
    for (int64_t g = 0; g < n / 16; g++)
        for (int64_t r0 = 0; r0 < M; r0 += X16_ROWS) {
            int R = (int)(M - r0 < X16_ROWS ? M - r0 : X16_ROWS);
            x16_group(type, R, X + g * nb * gb, nb, acts, r0, K, bias ? bias + g * 16 : NULL, y + g * 16, ldy);
        }
    return 0;
}
#endif
