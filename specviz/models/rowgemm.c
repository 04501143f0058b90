/* rowgemm: y = x @ W.T (+ bias) for a few rows, fp16 weights read once for all rows, fp32 arithmetic.

   Why a kernel of our own: a CPU step of the 1.5B target reads 3.1 GB of fp16 weights; fbgemm's fp16 kernel
   reads them again for each small group of rows, uses one core for one row, and builds some row counts
   with other kernels (other last bits). This one reads each weight once per call whatever the row count,
   splits the output columns over every core, and computes every output element as one fp32 FMA chain over
   k = 0 .. K-1 in order, started from zero, then adds the bias. Nothing in that chain depends on M or on the
   other rows: a row's output has the same bits alone or among any others, by construction.

   Weight layout ("panels"): W (N, K) fp16 is stored as (N/64, K, 64): for each block of 64 output columns,
   the 64 weights of k = 0, then of k = 1, ... (one sequential stream per block). N is padded to 64 with zero
   columns at packing; the padding is never written out.

   Built at first use with the machine's own compiler (gcc -O3 -march=native -fopenmp), loaded with ctypes
   after torch, so that its OpenMP team is torch's own (torch ships libgomp.so.1 under that soname).
*/
#include <stdint.h>
#include <string.h>
#include <immintrin.h>

#define COLS 64   /* output columns per panel */
#define KC 256    /* k values per chunk: a chunk of a panel (32 KB) stays in L1/L2 while every row block uses it */
#define SUPER 48  /* rows whose accumulators live in one thread's buffer (12 KB): up to 48 rows read the weights once */

/* One micro-kernel body per weight type, made by a macro: fp16 panels (the target) and int8 panels (the draft,
   whose per-column scale is applied once at the end). W16(p) / W8(p) load 16 (AVX-512) or 8 (AVX2) weights as fp32. */
#if defined(__AVX512F__)
#define ROWS 6    /* rows per block: 6 rows x 4 zmm accumulators + 4 weight registers + 1 broadcast <= 32 */
#define VEC __m512
#define VL 16
#define LOADF _mm512_loadu_ps
#define STOREF _mm512_storeu_ps
#define FMA _mm512_fmadd_ps
#define BCAST _mm512_set1_ps
#define W16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define W8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define ISA "avx512"
#define SPAN 64   /* columns one block covers: 4 vectors */
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define ROWS 2    /* 2 rows x 4 ymm (32 columns) + 4 weights + 1 broadcast <= 16 registers; a panel is two halves */
#define VEC __m256
#define VL 8
#define LOADF _mm256_loadu_ps
#define STOREF _mm256_storeu_ps
#define FMA _mm256_fmadd_ps
#define BCAST _mm256_set1_ps
#define W16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define W8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define ISA "avx2"
#define SPAN 32
#endif

#ifdef VEC
#define DEFINE_BLOCK(NAME, WT, WLOAD)                                                                              \
static inline void NAME(int R, const float *x, int64_t ldx, const WT *panel, int64_t k0, int64_t k1, float *acc) { \
    for (int h = 0; h < COLS; h += SPAN) {                                                                         \
        VEC a[ROWS][4];                                                                                            \
        for (int r = 0; r < R; r++)                                                                                \
            for (int j = 0; j < 4; j++) a[r][j] = LOADF(acc + r * COLS + h + VL * j);                              \
        for (int64_t k = k0; k < k1; k++) {                                                                        \
            const WT *w = panel + k * COLS + h;                                                                    \
            VEC w0 = WLOAD(w), w1 = WLOAD(w + VL), w2 = WLOAD(w + 2 * VL), w3 = WLOAD(w + 3 * VL);                 \
            for (int r = 0; r < R; r++) { /* R is a constant in each copy block_any makes */                      \
                VEC b = BCAST(x[r * ldx + k]);                                                                     \
                a[r][0] = FMA(b, w0, a[r][0]);                                                                     \
                a[r][1] = FMA(b, w1, a[r][1]);                                                                     \
                a[r][2] = FMA(b, w2, a[r][2]);                                                                     \
                a[r][3] = FMA(b, w3, a[r][3]);                                                                     \
            }                                                                                                      \
        }                                                                                                          \
        for (int r = 0; r < R; r++)                                                                                \
            for (int j = 0; j < 4; j++) STOREF(acc + r * COLS + h + VL * j, a[r][j]);                              \
    }                                                                                                              \
}
DEFINE_BLOCK(block_f16, uint16_t, W16)
DEFINE_BLOCK(block_i8, int8_t, W8)

#else
#define ROWS 4
#define ISA "portable"
/* portable: the same chain per element (fmaf: one rounding, as the vector FMAs) */
#include <math.h>
static inline void block_f16(int R, const float *x, int64_t ldx, const uint16_t *panel, int64_t k0, int64_t k1, float *acc) {
    for (int r = 0; r < R; r++)
        for (int c = 0; c < COLS; c++) {
            float s = acc[r * COLS + c];
            for (int64_t k = k0; k < k1; k++) s = fmaf(x[r * ldx + k], (float)((const _Float16 *)panel)[k * COLS + c], s);
            acc[r * COLS + c] = s;
        }
}
static inline void block_i8(int R, const float *x, int64_t ldx, const int8_t *panel, int64_t k0, int64_t k1, float *acc) {
    for (int r = 0; r < R; r++)
        for (int c = 0; c < COLS; c++) {
            float s = acc[r * COLS + c];
            for (int64_t k = k0; k < k1; k++) s = fmaf(x[r * ldx + k], (float)panel[k * COLS + c], s);
            acc[r * COLS + c] = s;
        }
}
#endif

/* A switch gives each row count R its own copy of a block, so that its accumulators stay in registers. */
#define DEFINE_ANY(NAME, BLOCK, WT)                                                                                 \
static void NAME(int R, const float *x, int64_t ldx, const WT *panel, int64_t k0, int64_t k1, float *acc) {       \
    switch (R) {                                                                                                   \
    case 1: if (ROWS >= 1) BLOCK(1, x, ldx, panel, k0, k1, acc); break;                                                         \
    case 2: if (ROWS >= 2) BLOCK(2, x, ldx, panel, k0, k1, acc); break;                                                         \
    case 3: if (ROWS >= 3) BLOCK(3, x, ldx, panel, k0, k1, acc); break;                                                         \
    case 4: if (ROWS >= 4) BLOCK(4, x, ldx, panel, k0, k1, acc); break;                                                         \
    case 5: if (ROWS >= 5) BLOCK(5, x, ldx, panel, k0, k1, acc); break;                                                         \
    case 6: if (ROWS >= 6) BLOCK(6, x, ldx, panel, k0, k1, acc); break;                                                         \
    default: break;                                                                                                \
    }                                                                                                              \
}
DEFINE_ANY(any_f16, block_f16, uint16_t)
DEFINE_ANY(any_i8, block_i8, int8_t)

const char *rowgemm_isa(void) { return ISA; }
int rowgemm_cols(void) { return COLS; }

/* y (M, ldy) = x (M, K) @ W.T (* scale) + bias, for output columns [0, N), W in panels (ceil(N/64), K, 64).
   Threads split the panels (the output columns); each element's chain is the same whichever thread runs it. */
#define DEFINE_GEMM(NAME, ANY, WT)                                                                                    \
void NAME(const float *x, int64_t M, int64_t K, const WT *panels, int64_t N, const float *scale, const float *bias,  \
          float *y, int64_t ldy) {                                                                                   \
    int64_t n_panels = (N + COLS - 1) / COLS;                                                                        \
    _Pragma("omp parallel for schedule(static)")                                                                     \
    for (int64_t p = 0; p < n_panels; p++) {                                                                         \
        const WT *panel = panels + p * K * COLS;                                                                     \
        int64_t c0 = p * COLS, width = N - c0 < COLS ? N - c0 : COLS;                                                \
        float acc[SUPER * COLS];                                                                                     \
        for (int64_t s0 = 0; s0 < M; s0 += SUPER) { /* up to SUPER rows share each chunk of the panel read */       \
            int64_t S = M - s0 < SUPER ? M - s0 : SUPER;                                                             \
            memset(acc, 0, sizeof(float) * S * COLS);                                                                \
            /* k chunks outside the row blocks: each element still runs k = 0 .. K-1 in order */                    \
            for (int64_t k0 = 0; k0 < K; k0 += KC) {                                                                 \
                int64_t k1 = k0 + KC < K ? k0 + KC : K;                                                              \
                for (int64_t m0 = 0; m0 < S; m0 += ROWS) {                                                           \
                    int R = S - m0 < ROWS ? (int)(S - m0) : ROWS;                                                    \
                    ANY(R, x + (s0 + m0) * K, K, panel, k0, k1, acc + m0 * COLS);                                    \
                }                                                                                                    \
            }                                                                                                        \
            for (int64_t r = 0; r < S; r++) {                                                                        \
                float *out = y + (s0 + r) * ldy + c0;                                                                \
                const float *a = acc + r * COLS;                                                                     \
                for (int64_t c = 0; c < width; c++) {                                                                \
                    float v = scale ? a[c] * scale[c0 + c] : a[c];                                                   \
                    out[c] = bias ? v + bias[c0 + c] : v;                                                            \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
    }                                                                                                                \
}
DEFINE_GEMM(rowgemm_f16, any_f16, uint16_t)
DEFINE_GEMM(rowgemm_i8, any_i8, int8_t)
