/* blockgemm: y = x @ W.T (+ bias) on a GGUF's quantized blocks as the file holds them, exact at any row count.

   Why: a CPU step reads every weight once, so its time is the bytes it reads. The 1.5B target's Q4_K_M file is
   1.1 GB; widened to fp16 it is 3.1 GB. This kernel reads the file's own blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
   Q4_K, Q5_K, Q6_K: ggml's layouts) and never widens them in memory.

   How, and why each row's bits never depend on its neighbours:
   - each activation row is quantized alone to int8, one scale per block of the weight's block size (256 for the
     K types, 32 for the others), with the bsums of every 16 values (as ggml's q8_K / q8_0);
   - each weight block is unpacked once per call into registers (its 4/5/6/8-bit values as bytes, the sub-block
     scales as int16 lanes, the offsets and the block's float scales), then used for every activation row;
   - one block's dot product is an integer sum: exact, so the vector width and the order of the adds cannot
     change it, and every path (AVX-512, AVX2, portable C) gives the same integer;
   - the integers of a block are kept in 8 lanes, lane l holding the products of weights 32c + 4l .. 32c + 4l + 3
     (c = 0, 1, ...: what an AVX2 register's madd gives, and an AVX-512 register's two halves added), the
     offsets of 16-groups 2l and 2l+1 in lane l (32-blocks: all in lane 0); exact on every path;
   - the floats are then taken in one fixed order, the same on every path: each block adds
     (dw*da)*lane [+ (gw*da)*min lane, for types with a min] to 8 float lane sums, block after block, and the
     lanes are added pairwise at the end, then the bias. No FMA contraction (-ffp-contract=off), so the vector
     and scalar code round alike.
   So a row alone, the same row among 16 others, and the same row on another CPU's path give the same bits.
   This is the path of matrices read as stored; blockgemm_x16.h holds the faster one models use, 16 rows side by
   side, with its own fixed float order.

   Built at first use with the machine's own compiler, one shared object per instruction set (see blocks.py).
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#if defined(__AVX512VNNI__)
#define ISA "avx512-vnni"
#else
#define ISA "avx512"
#endif
#define USE512 1
#elif defined(__AVX2__)
#define ISA "avx2"
#define USE256 1
#else
#define ISA "portable"
#endif

/* ggml's type ids */
enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

#define LANES 8 /* blocks' float terms go to LANES partial sums, whatever the instruction set */

const char *blockgemm_isa(void) { return ISA; }

/* bytes per block and weights per block of a type (0: not handled here) */
int blockgemm_block_bytes(int type) {
    switch (type) {
    case Q4_0: return 18; case Q4_1: return 20; case Q5_0: return 22; case Q5_1: return 24; case Q8_0: return 34;
    case Q4_K: return 144; case Q5_K: return 176; case Q6_K: return 210;
    default: return 0;
    }
}
int blockgemm_block_size(int type) {
    return type == Q4_K || type == Q5_K || type == Q6_K ? 256 : blockgemm_block_bytes(type) ? 32 : 0;
}

#include "blockgemm_blocks.h"

/* ---------------------------------------------------------------------------------------------------------------
   Activations: each row alone, int8 per block of bs values with one float scale, and the sum of every 16
   -------------------------------------------------------------------------------------------------------------- */
typedef struct {
    int8_t *q;     /* (M, K) */
    int16_t *sum;  /* (M, K/16) */
    float *d;      /* (M, K/bs) */
} Acts;

static void quantize_row(const float *x, int64_t k, int bs, int8_t *q, int16_t *sum, float *d) {
    for (int64_t b = 0; b < k / bs; b++) {
        const float *xb = x + b * bs;
        float amax = 0.0f;
        for (int i = 0; i < bs; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        d[b] = amax / 127.0f;
        for (int i = 0; i < bs; i++) {
            float v = nearbyintf(xb[i] * id);
            q[b * bs + i] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : (int)v);
        }
    }
    for (int64_t g = 0; g < k / 16; g++) {
        int t = 0;
        for (int i = 0; i < 16; i++) t += q[16 * g + i];
        sum[g] = (int16_t)t;
    }
}

/* the M rows of x quantized into `acts` (freed by acts_free, also after a failure); 0, or -1 without memory */
static int acts_of(const float *x, int64_t M, int64_t K, int bs, Acts *acts) {
    acts->q = malloc((size_t)(M * K));
    acts->sum = malloc(sizeof(int16_t) * (size_t)(M * (K / 16)));
    acts->d = malloc(sizeof(float) * (size_t)(M * (K / bs)));
    if (!acts->q || !acts->sum || !acts->d) return -1;
    for (int64_t r = 0; r < M; r++)
        quantize_row(x + r * K, K, bs, acts->q + r * K, acts->sum + r * (K / 16), acts->d + r * (K / bs));
    return 0;
}

static void acts_free(Acts *acts) {
    free(acts->q);
    free(acts->sum);
    free(acts->d);
}

/* ---------------------------------------------------------------------------------------------------------------
   Vector paths: each block unpacked once into registers (its values in natural order, its scales as int16
   lanes), then used for every activation row.
   -------------------------------------------------------------------------------------------------------------- */
#if defined(USE512) || defined(USE256)
#if defined(USE512)
#define KV 4 /* vectors of 64 weights */
typedef __m512i kvec;
#else
#define KV 8 /* vectors of 32 weights */
typedef __m256i kvec;
#endif
typedef struct {
    kvec w[KV], s[KV];  /* values (u8) and the scale of each pair of them (int16) */
    __m256i oi, om;     /* offsets per 16-group (int16) */
    int has_oi;
    float fw, gw;
} KBlock;

static inline float f16c(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h); /* exact, as f16() */
}

static inline void kload_q4k(const uint8_t *x, int q5, KBlock *kb) {
    uint32_t u0, u1, u2;
    memcpy(&u0, x + 4, 4);
    memcpy(&u1, x + 8, 4);
    memcpy(&u2, x + 12, 4);
    /* the 8 six-bit scales and mins of k_scale_min, four at a time in 32-bit words */
    uint32_t sc_lo = u0 & 0x3f3f3f3fu, sc_hi = (u2 & 0x0f0f0f0fu) | (((u0 >> 6) & 0x03030303u) << 4);
    uint32_t m_lo = u1 & 0x3f3f3f3fu, m_hi = ((u2 >> 4) & 0x0f0f0f0fu) | (((u1 >> 6) & 0x03030303u) << 4);
    __m128i mb = _mm_set_epi32(0, 0, (int)m_hi, (int)m_lo);
    kb->om = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mb, mb)); /* m0 m0 m1 m1 ... m7 m7: one per 16-group */
    kb->oi = _mm256_setzero_si256();
    kb->has_oi = 0;
    kb->fw = f16c(x);
    kb->gw = -f16c(x + 2);
    const uint8_t *qs = x + (q5 ? 48 : 16);
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(x + 16)) : _mm256_setzero_si256();
#if defined(USE512)
    __m512i sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)sc_hi, (int)sc_lo)));
#else
    uint8_t scb[8];
    memcpy(scb, &sc_lo, 4);
    memcpy(scb + 4, &sc_hi, 4);
#endif
    for (int c = 0; c < 4; c++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (q5) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1)), one), 4));
        }
#if defined(USE512)
        kb->w[c] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        kb->s[c] = _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_set1_epi16((short)(2 * c)),
                                            _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20,
                                            19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 4)), sc);
#else
        kb->w[2 * c] = lo;
        kb->w[2 * c + 1] = hi;
        kb->s[2 * c] = _mm256_set1_epi16(scb[2 * c]);
        kb->s[2 * c + 1] = _mm256_set1_epi16(scb[2 * c + 1]);
#endif
    }
}

static inline void kload_q6k(const uint8_t *x, KBlock *kb) {
    const uint8_t *ql = x, *qh = x + 128;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + 192))); /* 16 scales, int16 */
    kb->oi = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));  /* -32 * scale */
    kb->om = _mm256_setzero_si256();
    kb->has_oi = 1;
    kb->fw = f16c(x + 208);
    kb->gw = 0.0f;
    for (int h = 0; h < 2; h++) {
        __m256i l0 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h)), l1 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32));
        __m256i hb = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
        __m256i y0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
        __m256i y1 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
        __m256i y2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
        __m256i y3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
#if defined(USE512)
        kb->w[2 * h] = _mm512_inserti64x4(_mm512_castsi256_si512(y0), y1, 1);
        kb->w[2 * h + 1] = _mm512_inserti64x4(_mm512_castsi256_si512(y2), y3, 1);
#else
        kb->w[4 * h] = y0;
        kb->w[4 * h + 1] = y1;
        kb->w[4 * h + 2] = y2;
        kb->w[4 * h + 3] = y3;
#endif
    }
#if defined(USE512)
    __m512i sc = _mm512_castsi256_si512(sc16);
    __m512i lane8 = _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                                       15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3);
    for (int c = 0; c < 4; c++) /* pair lane i of vector c covers 16-group 4c + i/8 */
        kb->s[c] = _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_set1_epi16((short)(4 * c)), lane8), sc);
#else
    int8_t scb[16];
    memcpy(scb, x + 192, 16);
    for (int p = 0; p < 8; p++) /* 32 weights: groups 2p and 2p+1 */
        kb->s[p] = _mm256_setr_m128i(_mm_set1_epi16(scb[2 * p]), _mm_set1_epi16(scb[2 * p + 1]));
#endif
}

/* Σ s_i w_i a_i of one block and one row, as a vector of 8 int32 (the offsets added where the type has them) */
static inline __m256i kdot(const KBlock *kb, const int8_t *a, const int16_t *sum) {
#if defined(USE512)
    __m512i acc = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        __m512i p = _mm512_maddubs_epi16(kb->w[c], _mm512_loadu_si512(a + 64 * c));
#if defined(__AVX512VNNI__)
        acc = _mm512_dpwssd_epi32(acc, p, kb->s[c]);
#else
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, kb->s[c]));
#endif
    }
    __m256i v = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
#else
    __m256i v = _mm256_setzero_si256();
    for (int c = 0; c < 8; c++)
        v = _mm256_add_epi32(v, _mm256_madd_epi16(_mm256_maddubs_epi16(kb->w[c], _mm256_loadu_si256((const __m256i *)(a + 32 * c))),
                                                  kb->s[c]));
#endif
    if (kb->has_oi) v = _mm256_add_epi32(v, _mm256_madd_epi16(kb->oi, _mm256_loadu_si256((const __m256i *)sum)));
    return v;
}


/* one K block's float terms for one row: (d*da)*lanes [+ (-dmin*da)*min lanes] */
static inline __m256 kterm(const KBlock *kb, const int8_t *a, const int16_t *sum, float da, int mins) {
    __m256 t = _mm256_mul_ps(_mm256_set1_ps(kb->fw * da), _mm256_cvtepi32_ps(kdot(kb, a, sum)));
    if (mins) {
        __m256i im = _mm256_madd_epi16(kb->om, _mm256_loadu_si256((const __m256i *)sum));
        t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_set1_ps(kb->gw * da), _mm256_cvtepi32_ps(im)));
    }
    return t;
}

/* A block of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) in a register: its values with their offset applied (q - 8, q - 16: signed
   bytes, as Q8_0's) or, for the types with a min, as stored (unsigned), and its float scales */
typedef struct {
    __m256i w, wabs; /* values, and their magnitudes for the sign trick (signed types) */
    int is_signed;
    float fw, gw;
} LBlock;

static inline void lload(int type, const uint8_t *x, LBlock *lb) {
    const __m128i m4 = _mm_set1_epi8(0x0F);
    lb->fw = f16c(x);
    lb->gw = (type == Q4_1 || type == Q5_1) ? f16c(x + 2) : 0.0f;
    lb->is_signed = !(type == Q4_1 || type == Q5_1);
    if (type == Q8_0) {
        lb->w = _mm256_loadu_si256((const __m256i *)(x + 2));
        lb->wabs = _mm256_abs_epi8(lb->w);
        return;
    }
    int qs_at = type == Q4_0 ? 2 : type == Q4_1 ? 4 : type == Q5_0 ? 6 : 8;
    __m128i v = _mm_loadu_si128((const __m128i *)(x + qs_at));
    __m256i w = _mm256_setr_m128i(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    if (type == Q5_0 || type == Q5_1) { /* bit i of qh is bit 4 of value i */
        uint32_t qh;
        memcpy(&qh, x + qs_at - 4, 4);
        __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                            _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                             2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
        __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
        __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
        w = _mm256_or_si256(w, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
    if (type == Q4_0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(8));
    if (type == Q5_0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(16));
    lb->w = w;
    lb->wabs = lb->is_signed ? _mm256_abs_epi8(w) : w;
}

/* lane l: the sum of the 4 products of weights 4l .. 4l+3 with their activations (exact) */
static inline __m256i ldot(const LBlock *lb, __m256i a) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (lb->is_signed) a = _mm256_sign_epi8(a, lb->w);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(lb->wabs, a), ones);
}

/* lane l: the sum of activations 4l .. 4l+3 (the min's share, for Q4_1 and Q5_1) */
static inline __m256i lsum(__m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), a), _mm256_set1_epi16(1));
}

/* one 32-block's float terms for one row (its 32 activations at a): (d*da)*lanes [+ (m*da)*sum lanes] */
static inline __m256 lterm(const LBlock *lb, const int8_t *a, float da, int mins) {
    __m256i x = _mm256_loadu_si256((const __m256i *)a);
    __m256 t = _mm256_mul_ps(_mm256_set1_ps(lb->fw * da), _mm256_cvtepi32_ps(ldot(lb, x)));
    if (mins) t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_set1_ps(lb->gw * da), _mm256_cvtepi32_ps(lsum(x))));
    return t;
}
#endif /* vector paths */

/* ---------------------------------------------------------------------------------------------------------------
   The float order, shared by every path: per block, lane sums acc[l] += (f*lane_int[l] [+ g*min_int[l]])
   -------------------------------------------------------------------------------------------------------------- */
static inline void fold(float *acc, const int32_t *is, const int32_t *im, float f, float g, int with_min) {
    for (int l = 0; l < LANES; l++) {
        float t = f * (float)is[l];
        if (with_min) t = t + g * (float)im[l];
        acc[l] = acc[l] + t;
    }
}

static inline float lanes_total(const float *acc) {
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static int has_min(int type) { return type == Q4_1 || type == Q5_1 || type == Q4_K || type == Q5_K; }

#if !defined(USE512) && !defined(USE256)
/* the portable path: one unpacked block against one row, as 8 lane integers */
static void lanes_of(int bs, int is_signed, const uint8_t *w, const int16_t *s, const int16_t *oi, const int16_t *om,
                     const int8_t *a, const int16_t *sum, int32_t *is, int32_t *im) {
    for (int l = 0; l < LANES; l++) is[l] = im[l] = 0;
    for (int i = 0; i < bs; i++) {
        int32_t p = (is_signed ? (int32_t)(int8_t)w[i] : (int32_t)w[i]) * a[i];
        is[(i % 32) / 4] += bs == 256 ? p * s[i / 2] : p;
    }
    if (bs == 256)
        for (int l = 0; l < LANES; l++) {
            is[l] += (int32_t)oi[2 * l] * sum[2 * l] + (int32_t)oi[2 * l + 1] * sum[2 * l + 1];
            im[l] = (int32_t)om[2 * l] * sum[2 * l] + (int32_t)om[2 * l + 1] * sum[2 * l + 1];
        }
    else /* the offset is in each value (q - 8, q - 16), the min's share per lane */
        for (int i = 0; i < 32; i++) {
            is[i / 4] += (int32_t)oi[i / 16] * a[i];
            im[i / 4] += (int32_t)om[i / 16] * a[i];
        }
}
#endif

#if defined(USE512) || defined(USE256)
/* One weight row against one activation row (a step): the same terms in the same order as row_times_acts, the lane
   sums kept in a register (in memory, each block's add waited on the last one's store) */
static float row_times_one(int type, const uint8_t *row, int64_t nb, const Acts *acts) {
    int bb = blockgemm_block_bytes(type), mins = has_min(type);
    __m256 acc = _mm256_setzero_ps();
    if (blockgemm_block_size(type) == 256)
        for (int64_t b = 0; b < nb; b++) {
            KBlock kb;
            if (type == Q6_K) kload_q6k(row + b * bb, &kb);
            else kload_q4k(row + b * bb, type == Q5_K, &kb);
            acc = _mm256_add_ps(acc, kterm(&kb, acts->q + b * 256, acts->sum + b * 16, acts->d[b], mins));
        }
    else
        for (int64_t b = 0; b < nb; b++) {
            LBlock lb;
            lload(type, row + b * bb, &lb);
            acc = _mm256_add_ps(acc, lterm(&lb, acts->q + b * 32, acts->d[b], mins));
        }
    float lanes[LANES];
    _mm256_storeu_ps(lanes, acc);
    return lanes_total(lanes);
}
#endif

/* One weight row against all M activation rows: y[r * ldy] for r < M; acc: M * LANES floats of this thread.
   Each block is unpacked once, then used for every row. */
static void row_times_acts(int type, const uint8_t *row, int64_t nb, const Acts *acts, int64_t M, int64_t K,
                           float *y, int64_t ldy, const float *bias, float *acc) {
    int bs = blockgemm_block_size(type), bb = blockgemm_block_bytes(type), mins = has_min(type);
#if defined(USE512) || defined(USE256)
    if (M == 1) {
        float v = row_times_one(type, row, nb, acts);
        *y = bias ? v + *bias : v;
        return;
    }
#endif
    memset(acc, 0, sizeof(float) * M * LANES);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *x = row + b * bb;
#if defined(USE512) || defined(USE256)
        if (bs == 256) {
            KBlock kb;
            if (type == Q6_K) kload_q6k(x, &kb);
            else kload_q4k(x, type == Q5_K, &kb);
            for (int64_t r = 0; r < M; r++) {
                __m256 t = kterm(&kb, acts->q + r * K + b * 256, acts->sum + r * (K / 16) + b * 16, acts->d[r * nb + b], mins);
                _mm256_storeu_ps(acc + r * LANES, _mm256_add_ps(_mm256_loadu_ps(acc + r * LANES), t));
            }
        } else {
            LBlock lb;
            lload(type, x, &lb);
            for (int64_t r = 0; r < M; r++) {
                __m256 t = lterm(&lb, acts->q + r * K + b * 32, acts->d[r * nb + b], mins);
                _mm256_storeu_ps(acc + r * LANES, _mm256_add_ps(_mm256_loadu_ps(acc + r * LANES), t));
            }
        }
#else
        uint8_t w[256];
        int16_t s[128], oi[16], om[16];
        float fw, gw;
        unpack_block(type, x, w, s, oi, om, &fw, &gw);
        for (int64_t r = 0; r < M; r++) {
            int32_t is[LANES], im[LANES];
            float da = acts->d[r * nb + b];
            lanes_of(bs, type == Q8_0, w, s, oi, om, acts->q + r * K + b * bs, acts->sum + r * (K / 16) + b * (bs / 16), is, im);
            fold(acc + r * LANES, is, im, fw * da, gw * da, mins);
        }
#endif
    }
    for (int64_t r = 0; r < M; r++) {
        float v = lanes_total(acc + r * LANES);
        y[r * ldy] = bias ? v + *bias : v;
    }
}

#include "blockgemm_x16.h"

/* ---------------------------------------------------------------------------------------------------------------
   The entry points
   -------------------------------------------------------------------------------------------------------------- */

/* y (M, ldy) = x (M, K) @ W.T + bias for the N rows of W, each `row_bytes` long (K / block size blocks) in `type`.
   Returns 0, or -1 for a type or shape it does not handle, or no memory (nothing written). Threads split W's rows. */
int blockgemm_linear(int type, const uint8_t *W, int64_t row_bytes, int64_t N, int64_t K, const float *x, int64_t M,
                     const float *bias, float *y, int64_t ldy) {
    int bs = blockgemm_block_size(type);
    if (!bs || K % bs || row_bytes != K / bs * blockgemm_block_bytes(type) || M < 1 || N < 1) return -1;
    int64_t nb = K / bs;
    Acts acts;
    int failed = acts_of(x, M, K, bs, &acts);
#pragma omp parallel if (!failed)
    {
        float *acc = failed ? NULL : malloc(sizeof(float) * (size_t)(M * LANES));
        if (!acc) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++)
            if (acc) row_times_acts(type, W + n * row_bytes, nb, &acts, M, K, y + n, ldy, bias ? bias + n : NULL, acc);
        free(acc);
    }
    acts_free(&acts);
    return failed ? -1 : 0;
}

/* blockgemm_linear for a matrix repacked by blockgemm_repack_x16 (every type but Q5_K; N a multiple of 16) */
int blockgemm_linear_x16(int type, const uint8_t *X, int64_t N, int64_t K, const float *x, int64_t M, const float *bias,
                         float *y, int64_t ldy) {
    if (!blockgemm_x16_size(type, N, K) || M < 1) return -1;
    int bs = blockgemm_block_size(type);
    Acts acts;
#if defined(USE512)
    int failed = acts_of(x, M, K, bs, &acts) || x16_linear_regs(type, X, N, K / bs, &acts, M, K, bias, y, ldy);
#else
    int failed = acts_of(x, M, K, bs, &acts) || x16_linear(type, X, N, K / bs, &acts, M, K, bias, y, ldy);
#endif
    acts_free(&acts);
    return failed ? -1 : 0;
}

#include "blockgemm_rows.h"
#include "blockgemm_attend.h"
#include "blockgemm_glue.h"
