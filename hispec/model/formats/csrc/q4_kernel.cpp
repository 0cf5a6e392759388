// HiSpec's 4-bit CPU kernel: y = x @ W.T with W kept in the GGUF file's own block formats.
//
// Q4_1 (the default model's decoder layers): blocks of 32 weights along the input dimension,
// 16 bytes of 4-bit values q (byte j: weight j in the low nibble, weight j + 16 in the high one),
// a float16 scale d and minimum m per block:  w = d * q + m.
// Q8_0 (its embedding, tied to the LM head): blocks of 32 signed bytes q and a float16 scale d:
// w = d * q.
//
// The arithmetic (per output element, per block b of 32 weights):
//     t_b = sum_i q_i * x_i       the block's integers widened to floats in registers, lane by lane
//     acc = fma(d_b, t_b, acc)    blocks in order, one accumulator per element
//     y   = lanes(acc) [+ sum_b m_b * sum(x_b)]    a fixed lane tree; Q4_1's minimum term apart
// No float weight is ever formed in memory: the file's bytes are read and widened in registers.
// Mathematically this is x . (d * q + m); in float32 it rounds differently from a product with the
// dequantised weights (the float32 path), which is why the two formats' outputs can part after a
// while. (Widening to w = fma(d, q, m) first, the float32 path's exact weights, costs a multiply-add
// per vector more: slower on one-token steps, measured; see hispec/model/q4.py.)
//
// Batch invariance: every output element (row r, column n) is accumulated in its own registers in
// the order above, which the block and lane layout alone fix. Tiles of rows only decide which rows
// share a decoded block, never how one is summed; threads split the columns, never a sum. So a
// row's bits do not depend on how many rows a call carries. Built with -ffp-contract=off: the
// compiler fuses nothing on its own.
//
// One source, two builds: -mavx512f -mavx512bw -mavx512vl (16 lanes) or -mavx2 -mfma -mf16c
// (8 lanes). They give different bits (different lane sums); each is exact to itself.

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

namespace {

constexpr int QK = 32;  // weights per block
constexpr int NA = 2;   // accumulators per output element

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define HISPEC_ISA "avx512"
constexpr int VL = 16;
typedef __m512 vf;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset1(float a) { return _mm512_set1_ps(a); }
inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline void vstore(float *p, vf a) { _mm512_storeu_ps(p, a); }
inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf vfloor(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
inline vf vpow2i(vf n) {  // 2^n for integral n in [-126, 127]
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
inline float vsum(vf v) {  // a fixed tree: 16 -> 8 -> 4 -> 2 -> 1
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}
// 16 bytes of nibbles -> q as floats: w[0] = weights 0..15 (low nibbles), w[1] = 16..31 (high)
inline void q4_values(const uint8_t *q, vf w[2]) {
    __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    w[0] = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(15)));
    w[1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
}
inline void q8_values(const int8_t *q, vf w[2]) {
    w[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
    w[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
}
// (rows, columns) tiles: columns per tile for a tile of R rows
constexpr int ROWS = 8;  // rows per tile (a column's blocks are decoded once per tile)
#else
#define HISPEC_ISA "avx2"
constexpr int VL = 8;
typedef __m256 vf;
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vset1(float a) { return _mm256_set1_ps(a); }
inline vf vload(const float *p) { return _mm256_loadu_ps(p); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
inline void vstore(float *p, vf a) { _mm256_storeu_ps(p, a); }
inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
inline vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf vfloor(vf a) { return _mm256_floor_ps(a); }
inline vf vpow2i(vf n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline float vsum(vf v) {  // 8 -> 4 -> 2 -> 1
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}
// w[0..3] = weights 0..7, 8..15 (low nibbles of bytes 0..7, 8..15), 16..23, 24..31 (high nibbles)
inline void q4_values(const uint8_t *q, vf w[4]) {
    __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8)));
    __m256i mask = _mm256_set1_epi32(15);
    w[0] = _mm256_cvtepi32_ps(_mm256_and_si256(a, mask));
    w[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b, mask));
    w[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
    w[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}
inline void q8_values(const int8_t *q, vf w[4]) {
    for (int j = 0; j < 4; j++)
        w[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * j))));
}
constexpr int ROWS = 4;
#endif

constexpr int NV = QK / VL;  // vectors per block

inline float half(uint16_t h) { return _cvtsh_ss(h); }

// Q4_1: per column n, nb blocks of 16 bytes of nibbles, nb float16 scales d and minimums m.
struct Q41 {
    const uint8_t *qs;
    const uint16_t *d;
    const uint16_t *m;
    int64_t nb;
    static constexpr bool has_min = true;
    static constexpr int64_t block_bytes = QK / 2;
    inline void values(int64_t n, int64_t b, vf w[NV]) const { q4_values(qs + (n * nb + b) * (QK / 2), w); }
};

// Q8_0: per column n, nb blocks of 32 signed bytes and nb float16 scales d.
struct Q80 {
    const int8_t *qs;
    const uint16_t *d;
    const uint16_t *m = nullptr;
    int64_t nb;
    static constexpr bool has_min = false;
    static constexpr int64_t block_bytes = QK;
    inline void values(int64_t n, int64_t b, vf w[NV]) const { q8_values(qs + (n * nb + b) * QK, w); }
};

// sum_b m[b] * s[b] over nb blocks in a fixed order: 8 at a time, then the tail one by one.
inline float min_term(const uint16_t *m, const float *s, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8)
        acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + b))), _mm256_loadu_ps(s + b), acc);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float total = _mm_cvtss_f32(h);
    for (; b < nb; b++) {
        float p = half(m[b]) * s[b];
        total = total + p;
    }
    return total;
}

// Rows [0, R) of x (row stride ldx; block sums sx, row stride nb) times column n of W -> out[r * ldo + n].
// Per element and block b: t = q_b . x_b over the block's integers as floats, lane by lane (a product
// and an FMA per vector), then acc = fma(d_b, t, acc); at the end the lanes' fixed tree, plus
// sum_b m_b * sum(x_b) for Q4_1. One accumulator per element, blocks in order.
template <int R, class W>
inline __attribute__((always_inline)) void column(const float *x, int64_t ldx, const float *sx, const W &w, int64_t n,
                                                  float *out, int64_t ldo) {
    vf acc[R];
    for (int r = 0; r < R; r++) acc[r] = vzero();
    for (int64_t b = 0; b < w.nb; b++) {
        vf q[NV];
        w.values(n, b, q);
        vf dv = vset1(half(w.d[n * w.nb + b]));
        const float *xb = x + b * QK;
        for (int r = 0; r < R; r++) {
            const float *xr = xb + r * ldx;
            vf t = vmul(q[0], vload(xr));
            for (int j = 1; j < NV; j++) t = vfma(q[j], vload(xr + j * VL), t);
            acc[r] = vfma(dv, t, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        float total = vsum(acc[r]);
        if constexpr (W::has_min) total = total + min_term(w.m + n * w.nb, sx + r * w.nb, w.nb);
        out[r * ldo + n] = total;
    }
}

// C columns n .. n + C - 1 at once: each column's arithmetic is exactly column<R>'s (the same operations
// in the same order on the same values, so the same bits); interleaving C independent accumulator
// chains only lets the core overlap them (one column's chain of block FMAs is latency-bound).
template <int R, int C, class W>
inline __attribute__((always_inline)) void column_group(const float *x, int64_t ldx, const float *sx, const W &w,
                                                        int64_t n, float *out, int64_t ldo) {
    vf acc[C][R];
    for (int c = 0; c < C; c++)
        for (int r = 0; r < R; r++) acc[c][r] = vzero();
    for (int64_t b = 0; b < w.nb; b++) {
        const float *xb = x + b * QK;
        for (int c = 0; c < C; c++) {
            vf q[NV];
            w.values(n + c, b, q);
            vf dv = vset1(half(w.d[(n + c) * w.nb + b]));
            for (int r = 0; r < R; r++) {
                const float *xr = xb + r * ldx;
                vf t = vmul(q[0], vload(xr));
                for (int j = 1; j < NV; j++) t = vfma(q[j], vload(xr + j * VL), t);
                acc[c][r] = vfma(dv, t, acc[c][r]);
            }
        }
    }
    for (int c = 0; c < C; c++)
        for (int r = 0; r < R; r++) {
            float total = vsum(acc[c][r]);
            if constexpr (W::has_min) total = total + min_term(w.m + (n + c) * w.nb, sx + r * w.nb, w.nb);
            out[r * ldo + n + c] = total;
        }
}

// Column n's bytes (its blocks, scales and minimums) towards the cache, ahead of use. A column is a
// few hundred bytes: too short a stream for the hardware prefetcher to learn before it ends, so a
// step's weights (read once, from memory) stalled the products line by line (the LM head ran at a
// third of the speed it reaches with these hints). Prefetches change no arithmetic and never fault.
inline __attribute__((always_inline)) void prefetch_bytes(const void *p, int64_t n) {
    const char *c = (const char *)p;
    for (int64_t o = 0; o < n; o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
    _mm_prefetch(c + n - 1, _MM_HINT_T0);  // the last line, where the range does not start on a line
}
template <class W>
inline __attribute__((always_inline)) void prefetch_column(const W &w, int64_t n) {
    prefetch_bytes((const char *)w.qs + n * w.nb * W::block_bytes, w.nb * W::block_bytes);
    prefetch_bytes(w.d + n * w.nb, w.nb * 2);
    if constexpr (W::has_min) prefetch_bytes(w.m + n * w.nb, w.nb * 2);
}

// Columns [n0, n1) for a tile of R rows, a few columns at a time (fewer for more rows: registers).
template <int R, class W>
void columns(const float *x, int64_t ldx, const float *sx, const W &w, int64_t n0, int64_t n1, float *out,
             int64_t ldo) {
    constexpr int C = R <= 2 ? 4 : R <= 4 ? 2 : 1;
    int64_t n = n0;
    for (; n + C <= n1; n += C) {
        for (int c = 0; c < C; c++) prefetch_column(w, n + C + c);  // the next group's columns
        column_group<R, C>(x, ldx, sx, w, n, out, ldo);
    }
    for (; n < n1; n++) column<R>(x, ldx, sx, w, n, out, ldo);
}

template <class W>
void rows_tile(int R, const float *x, int64_t ldx, const float *sx, const W &w, int64_t n0, int64_t n1, float *out,
               int64_t ldo) {
    switch (R) {
    case 1: columns<1>(x, ldx, sx, w, n0, n1, out, ldo); break;
    case 2: columns<2>(x, ldx, sx, w, n0, n1, out, ldo); break;
    case 3: columns<3>(x, ldx, sx, w, n0, n1, out, ldo); break;
    case 4: columns<4>(x, ldx, sx, w, n0, n1, out, ldo); break;
    default:
        if constexpr (ROWS > 4) {
            switch (R) {
            case 5: columns<5 <= ROWS ? 5 : 1>(x, ldx, sx, w, n0, n1, out, ldo); break;
            case 6: columns<6 <= ROWS ? 6 : 1>(x, ldx, sx, w, n0, n1, out, ldo); break;
            case 7: columns<7 <= ROWS ? 7 : 1>(x, ldx, sx, w, n0, n1, out, ldo); break;
            case 8: columns<8 <= ROWS ? 8 : 1>(x, ldx, sx, w, n0, n1, out, ldo); break;
            }
        }
    }
}

// Per-row block sums of x (Q4_1's minimum term), each in the same fixed order.
void block_sums(const float *x, int64_t M, int64_t K, float *sx) {
    int64_t nb = K / QK;
    for (int64_t r = 0; r < M; r++)
        for (int64_t b = 0; b < nb; b++) {
            const float *p = x + r * K + b * QK;
            vf s = vload(p);
            for (int j = 1; j < NV; j++) s = vadd(s, vload(p + j * VL));
            sx[r * nb + b] = vsum(s);
        }
}

constexpr int64_t COLS_PER_TASK = 32;

template <class W>
void matmul(const float *x, int64_t M, int64_t K, const W &w, int64_t N, float *out, int64_t ldo, int nthreads) {
    int64_t nb = K / QK;
    float local[16 * 64];
    float *sx = nullptr;
    if (W::has_min) {
        sx = M * nb <= 16 * 64 ? local : (float *)malloc(sizeof(float) * M * nb);
        block_sums(x, M, K, sx);
    }
    int64_t tasks = (N + COLS_PER_TASK - 1) / COLS_PER_TASK;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && tasks > 1)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t n0 = t * COLS_PER_TASK, n1 = n0 + COLS_PER_TASK < N ? n0 + COLS_PER_TASK : N;
        for (int64_t r0 = 0; r0 < M; r0 += ROWS) {
            int R = (int)(M - r0 < ROWS ? M - r0 : ROWS);
            rows_tile(R, x + r0 * K, K, sx ? sx + r0 * nb : nullptr, w, n0, n1, out + r0 * ldo, ldo);
        }
    }
    if (sx && sx != local) free(sx);
}

}  // namespace

extern "C" {

// out[M, ldo] (its first N columns) = x[M, K] @ W[N, K].T, W in Q4_1 (K a multiple of 32).
void hispec_q41_matmul(const float *x, int64_t M, int64_t K, const uint8_t *qs, const uint16_t *d,
                       const uint16_t *m, int64_t N, float *out, int64_t ldo, int nthreads) {
    Q41 w{qs, d, m, K / QK};
    matmul(x, M, K, w, N, out, ldo, nthreads);
}

// out[M, ldo] (its first N columns) = x[M, K] @ W[N, K].T, W in Q8_0 (K a multiple of 32).
void hispec_q80_matmul(const float *x, int64_t M, int64_t K, const int8_t *qs, const uint16_t *d, int64_t N,
                       float *out, int64_t ldo, int nthreads) {
    Q80 w{qs, d, nullptr, K / QK};
    matmul(x, M, K, w, N, out, ldo, nthreads);
}

// Rows `ids` of a Q8_0 matrix as float32 (the embedding lookup): out[i, :] = d * q, exact.
void hispec_q80_rows(const int64_t *ids, int64_t count, int64_t K, const int8_t *qs, const uint16_t *d,
                     float *out) {
    int64_t nb = K / QK;
    for (int64_t i = 0; i < count; i++) {
        const int8_t *q = qs + ids[i] * K;
        const uint16_t *dd = d + ids[i] * nb;
        for (int64_t b = 0; b < nb; b++) {
            float s = half(dd[b]);
            for (int j = 0; j < QK; j++) out[i * K + b * QK + j] = s * (float)q[b * QK + j];
        }
    }
}

const char *hispec_q4_isa(void) { return HISPEC_ISA; }

}  // extern "C"


// ==================================================================================================
// int8 activations (the 'a8' precision level: the same Q4_1 weights, a cheaper product). Each row of x
// is quantised per block of 32: dx_b = amax_b / 127, xq_i = round(x_i / dx_b) in int8 (what llama.cpp
// computes for Q4_1 x Q8_1). Per output element and block, the 32 products q_i * xq_i are summed
// exactly in integers (VNNI's dpbusd where the build has it, else maddubs + madd: the same integers),
// then acc = fma(float(sums), d_b * dx_b, acc) lane by lane, blocks in order, and at the end the lanes'
// fixed tree plus the minimum term sum_b m_b * sum(x_b) over the float block sums of x (the unquantised
// row: more accurate than llama.cpp's dx_b * sum(xq_b)). Every element is accumulated in its own
// registers from its own row's quantisation, so this product is batch-invariant too.
//
// Layout of a quantised row (quantize_row): AVX-512 takes two blocks per 512-bit vector, so the bytes
// of a pair of blocks (b, b + 1) are stored [b 0..15 | b+1 0..15 | b 16..31 | b+1 16..31], the order
// in which two blocks' nibbles unpack (low nibbles = weights 0..15, high = 16..31); a last odd block
// keeps its natural order. dxe holds, per pair, the 16 lanes' activation scales
// [dx_b x4 | dx_b+1 x4 | dx_b x4 | dx_b+1 x4] (and, per odd last block, dx_b x16). AVX2 takes one
// block per 256-bit vector in natural order; dxe holds dx_b per block.
// ==================================================================================================

namespace {

constexpr int64_t DXE_PER_PAIR = VL == 16 ? 16 : 2;  // floats of dxe per pair of blocks

inline int64_t dxe_len(int64_t nb) { return (nb / 2) * DXE_PER_PAIR + (nb % 2) * (VL == 16 ? 16 : 1); }

inline void quantize_row(const float *x, int64_t K, int8_t *xq, float *dxe) {
    const int64_t nb = K / QK;
    int8_t blk[QK];
    float dx[2] = {0, 0};
    for (int64_t b = 0; b < nb; b++) {
        const float *p = x + b * QK;
        float amax = 0.0f;
        for (int i = 0; i < QK; i++) {
            float a = fabsf(p[i]);
            amax = a > amax ? a : amax;
        }
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int i = 0; i < QK; i++) {
            long v = lrintf(p[i] * id);
            blk[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
        const float d = amax / 127.0f;
        if (VL == 16 && (b % 2 == 0) && b + 1 < nb) {  // first of a pair
            memcpy(xq + b * QK, blk, 16);
            memcpy(xq + b * QK + 32, blk + 16, 16);
            dx[0] = d;
        } else if (VL == 16 && b % 2 == 1) {  // second of a pair
            memcpy(xq + (b - 1) * QK + 16, blk, 16);
            memcpy(xq + (b - 1) * QK + 48, blk + 16, 16);
            dx[1] = d;
            float *e = dxe + (b / 2) * DXE_PER_PAIR;
            for (int i = 0; i < 16; i++) e[i] = dx[(i / 4) % 2];
        } else {  // natural order: AVX2, or AVX-512's odd last block
            memcpy(xq + b * QK, blk, QK);
            if (VL == 16)
                for (int i = 0; i < 16; i++) dxe[(nb / 2) * DXE_PER_PAIR + i] = d;
            else
                dxe[b] = d;
        }
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
inline __m512i dot_u8s8(__m512i w, __m512i x) {  // 16 lanes, each the sum of 4 adjacent u8 * s8 products
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1));
#endif
}

template <int R>
inline __attribute__((always_inline)) void column_a8(const int8_t *xq, int64_t K, const float *dxe, int64_t lde,
                                                     const float *sx, const Q41 &w, int64_t n, float *out,
                                                     int64_t ldo) {
    const int64_t nb = w.nb;
    const uint8_t *qs = w.qs + n * nb * (QK / 2);
    const uint16_t *d = w.d + n * nb;
    const __m512i lanes = _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m256i low4 = _mm256_set1_epi8(15);
    vf acc[R];
    for (int r = 0; r < R; r++) acc[r] = vzero();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(qs + b * (QK / 2)));
        __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        __m512i wq = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        int32_t dd;
        memcpy(&dd, d + b, 4);
        __m512 dw = _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(dd))));
        for (int r = 0; r < R; r++) {
            __m512i s = dot_u8s8(wq, _mm512_loadu_si512((const void *)(xq + r * K + b * QK)));
            acc[r] = vfma(_mm512_cvtepi32_ps(s), vmul(dw, vload(dxe + r * lde + (b / 2) * DXE_PER_PAIR)), acc[r]);
        }
    }
    if (b < nb) {  // an odd last block: its 32 weights in the vector's low half, the high half zero
        __m128i v = _mm_loadu_si128((const __m128i *)(qs + b * (QK / 2)));
        __m128i lo = _mm_and_si128(v, _mm_set1_epi8(15)), hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15));
        __m512i wq = _mm512_zextsi256_si512(_mm256_set_m128i(hi, lo));
        vf dw = vset1(half(d[b]));
        for (int r = 0; r < R; r++) {
            __m512i x = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(xq + r * K + b * QK)));
            acc[r] = vfma(_mm512_cvtepi32_ps(dot_u8s8(wq, x)), vmul(dw, vload(dxe + r * lde + (b / 2) * DXE_PER_PAIR)),
                          acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r * ldo + n] = vsum(acc[r]) + min_term(w.m + n * nb, sx + r * nb, nb);
}
#else
template <int R>
inline __attribute__((always_inline)) void column_a8(const int8_t *xq, int64_t K, const float *dxe, int64_t lde,
                                                     const float *sx, const Q41 &w, int64_t n, float *out,
                                                     int64_t ldo) {
    const int64_t nb = w.nb;
    const uint8_t *qs = w.qs + n * nb * (QK / 2);
    const uint16_t *d = w.d + n * nb;
    const __m128i low4 = _mm_set1_epi8(15);
    const __m256i ones = _mm256_set1_epi16(1);
    vf acc[R];
    for (int r = 0; r < R; r++) acc[r] = vzero();
    for (int64_t b = 0; b < nb; b++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(qs + b * (QK / 2)));
        __m256i wq = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low4), _mm_and_si128(v, low4));
        const float dw = half(d[b]);
        for (int r = 0; r < R; r++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(xq + r * K + b * QK));
            __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, x), ones);
            acc[r] = vfma(_mm256_cvtepi32_ps(s), vset1(dw * dxe[r * lde + b]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r * ldo + n] = vsum(acc[r]) + min_term(w.m + n * nb, sx + r * nb, nb);
}
#endif

template <int R>
void columns_a8(const int8_t *xq, int64_t K, const float *dxe, int64_t lde, const float *sx, const Q41 &w, int64_t n0,
                int64_t n1, float *out, int64_t ldo) {
    for (int64_t n = n0; n < n1; n++) column_a8<R>(xq, K, dxe, lde, sx, w, n, out, ldo);
}

// Columns [n0, n1) of the quantised rows (M of them) times a Q4_1 matrix, rows in tiles of up to 4.
inline void product_cols_a8(const int8_t *xq, const float *dxe, int64_t M, const float *sx, const Q41 &w, int64_t n0,
                            int64_t n1, float *out, int64_t ldo) {
    const int64_t K = w.nb * QK, lde = dxe_len(w.nb);
    for (int64_t r0 = 0; r0 < M; r0 += 4) {
        const int R = (int)(M - r0 < 4 ? M - r0 : 4);
        const int8_t *x = xq + r0 * K;
        const float *e = dxe + r0 * lde, *s = sx + r0 * w.nb;
        float *o = out + r0 * ldo;
        switch (R) {
        case 1: columns_a8<1>(x, K, e, lde, s, w, n0, n1, o, ldo); break;
        case 2: columns_a8<2>(x, K, e, lde, s, w, n0, n1, o, ldo); break;
        case 3: columns_a8<3>(x, K, e, lde, s, w, n0, n1, o, ldo); break;
        default: columns_a8<4>(x, K, e, lde, s, w, n0, n1, o, ldo); break;
        }
    }
}

inline void quantize_rows(const float *x, int64_t M, int64_t K, int8_t *xq, float *dxe) {
    for (int64_t r = 0; r < M; r++) quantize_row(x + r * K, K, xq + r * K, dxe + r * dxe_len(K / QK));
}

}  // namespace

extern "C" {

// out[M, ldo] (its first N columns) = x[M, K] @ W[N, K].T, W in Q4_1, x quantised to int8 per block of 32.
void hispec_q41_matmul_a8(const float *x, int64_t M, int64_t K, const uint8_t *qs, const uint16_t *d,
                          const uint16_t *m, int64_t N, float *out, int64_t ldo, int nthreads) {
    Q41 w{qs, d, m, K / QK};
    const int64_t nb = K / QK;
    int8_t *xq = (int8_t *)malloc(M * K);
    float *dxe = (float *)malloc(sizeof(float) * M * dxe_len(nb));
    float *sx = (float *)malloc(sizeof(float) * M * nb);
    quantize_rows(x, M, K, xq, dxe);
    block_sums(x, M, K, sx);
    int64_t tasks = (N + COLS_PER_TASK - 1) / COLS_PER_TASK;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && tasks > 1)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t n0 = t * COLS_PER_TASK, n1 = n0 + COLS_PER_TASK < N ? n0 + COLS_PER_TASK : N;
        product_cols_a8(xq, dxe, M, sx, w, n0, n1, out, ldo);
    }
    free(xq);
    free(dxe);
    free(sx);
}

// 1 when this build's int8 products use VNNI (dpbusd), 0 for maddubs + madd (the same integers)
int hispec_q4_vnni(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}

}  // extern "C"

// ==================================================================================================
// The whole decoder layer (the 4-bit path's native route, hispec/model/q4_layer.py): for layers
// [0, n_layers) of `layers`, over q new rows (positions past .. past + q - 1) of hidden (q, E), in
// place:
//     x = RMSNorm(h) * w_in;  [q | k | v] = x @ Wqkv.T (+ b);  per-head RMSNorm of q, k (Qwen3);
//     rotary on q and k (the table's rows);  k, v written into the layer's KV cache at their positions;
//     attention of each query over cache positions [0, its own position];  h += attn @ Wo.T (+ b);
//     x = RMSNorm(h) * w_post;  h += (SiLU(x @ Wg.T) * (x @ Wu.T)) @ Wd.T
// One OpenMP region for the whole range; phases meet at barriers.
//
// Batch invariance, phase by phase (a row's bits never depend on the number of rows or its place):
// - products: the kernel above (per element, its own accumulator; threads split columns);
// - RMSNorm: one row's sum of squares, lanes then a fixed tree, then the tail in order; each thread
//   computes every row's norm into its own buffer (identical work, identical bits);
// - rotary, SiLU, residual adds, biases: elementwise;
// - attention: per (row, head) one thread; scores q . k_j (lanes, fixed tree) for j = 0 .. pos in order,
//   their max, exp(s_j - max) and their sum in order j = 0 .. pos, then sum_j e_j v_j in order j (one
//   accumulator per feature) times 1 / sum. All of it depends only on the row's own position and the
//   cache's contents at positions <= pos, which every pass writes with the same bits.
// ==================================================================================================

namespace {

struct Mat {  // a Q4_1 matrix [N, K]
    const uint8_t *qs;
    const uint16_t *d;
    const uint16_t *m;
    int64_t N, K;
};

}  // namespace

extern "C" {

struct hispec_layer {
    Mat qkv, o, gate_up, down;
    const float *qkv_bias, *o_bias, *gate_up_bias, *down_bias;  // may be null
    const float *in_norm, *post_norm;                           // [E]
    const float *q_norm, *k_norm;                               // [D] or null (per-head norms, Qwen3)
    float *keys, *values;                                       // [KV, cap, D]: this layer's cache
    int64_t cap;
};

struct hispec_dims {
    int64_t hidden, heads, kv_heads, head_dim, inter;
    float eps, qk_eps, scaling;
    int32_t act8;  // 1: the products take int8 activations per block of 32 (the 'a8' level); 0: float32
};

}  // extern "C"

namespace {

double g_prof[8];   // seconds per phase, accumulated by thread 0 (hispec_q4_profile)
int g_prof_on = 0;  // 0 off, 1 wall clock, 2 thread CPU time

inline double now() {
    timespec ts;
    clock_gettime(g_prof_on == 2 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Fixed-order sums over n floats: VL lanes, 2 accumulators interleaved, then a fixed tree, then the tail.
inline float dot(const float *a, const float *b, int64_t n) {
    vf s0 = vzero(), s1 = vzero();
    int64_t i = 0;
    for (; i + 2 * VL <= n; i += 2 * VL) {
        s0 = vfma(vload(a + i), vload(b + i), s0);
        s1 = vfma(vload(a + i + VL), vload(b + i + VL), s1);
    }
    for (; i + VL <= n; i += VL) s0 = vfma(vload(a + i), vload(b + i), s0);
    float t = vsum(vadd(s0, s1));
    for (; i < n; i++) t = t + a[i] * b[i];
    return t;
}

inline void rms_norm_row(const float *x, const float *w, int64_t n, float eps, float *y) {
    float ss = dot(x, x, n);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
}

inline void block_sums_rows(const float *x, int64_t M, int64_t K, float *sx) { block_sums(x, M, K, sx); }

// Columns [n0, n1) of x (M rows, stride K, block sums sx) @ W.T into out (stride ldo), rows tiled.
inline void product_cols(const float *x, int64_t M, const float *sx, const Mat &w, int64_t n0, int64_t n1, float *out,
                         int64_t ldo) {
    Q41 q{w.qs, w.d, w.m, w.K / QK};
    int64_t nb = w.K / QK;
    for (int64_t r0 = 0; r0 < M; r0 += ROWS) {
        int R = (int)(M - r0 < ROWS ? M - r0 : ROWS);
        rows_tile(R, x + r0 * w.K, w.K, sx + r0 * nb, q, n0, n1, out + r0 * ldo, ldo);
    }
}

// product_cols, or with act8 its int8-activation twin over the rows' quantisation (xq, dxe)
inline void product(bool act8, const float *x, const int8_t *xq, const float *dxe, int64_t M, const float *sx,
                    const Mat &w, int64_t n0, int64_t n1, float *out, int64_t ldo) {
    if (act8)
        product_cols_a8(xq, dxe, M, sx, Q41{w.qs, w.d, w.m, w.K / QK}, n0, n1, out, ldo);
    else
        product_cols(x, M, sx, w, n0, n1, out, ldo);
}

inline int64_t ntasks(int64_t N) { return (N + COLS_PER_TASK - 1) / COLS_PER_TASK; }

inline void rotate_head(float *x, const float *cos, const float *sin, int64_t D, float *tmp) {
    int64_t h = D / 2;
    for (int64_t i = 0; i < h; i++) tmp[i] = x[i] * cos[i] + (-x[i + h]) * sin[i];
    for (int64_t i = h; i < D; i++) tmp[i] = x[i] * cos[i] + x[i - h] * sin[i];
    memcpy(x, tmp, sizeof(float) * D);
}

// exp(x) lane by lane (Cephes' expf: x = n ln2 + r, a degree-5 polynomial in r, times 2^n), inputs
// clamped to [-87, 88]. A lane's result depends on its own input only, so it is the same in any
// vector, at any place; relative error about 2e-7 against expf.
inline vf vexp(vf x) {
    x = vmin(vmax(x, vset1(-87.0f)), vset1(88.0f));
    vf n = vfloor(vfma(x, vset1(1.44269504088896341f), vset1(0.5f)));
    x = vfma(n, vset1(-0.693359375f), x);
    x = vfma(n, vset1(2.12194440e-4f), x);
    vf y = vset1(1.9875691500e-4f);
    y = vfma(y, x, vset1(1.3981999507e-3f));
    y = vfma(y, x, vset1(8.3334519073e-3f));
    y = vfma(y, x, vset1(4.1665795894e-2f));
    y = vfma(y, x, vset1(1.6666665459e-1f));
    y = vfma(y, x, vset1(5.0000001201e-1f));
    y = vfma(y, vmul(x, x), vadd(x, vset1(1.0f)));
    return vmul(y, vpow2i(n));
}

// out[i] = exp(in[i]) for n floats (the tail through a padded vector: the same per-lane arithmetic)
inline void exp_n(const float *in, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + VL <= n; i += VL) vstore(out + i, vexp(vload(in + i)));
    if (i < n) {
        float pad[VL] = {0};
        for (int64_t j = i; j < n; j++) pad[j - i] = in[j];
        vstore(pad, vexp(vload(pad)));
        for (int64_t j = i; j < n; j++) out[j] = pad[j - i];
    }
}

// SiLU(g) * u over VL lanes: g / (1 + exp(-g)) * u
inline vf vsilu_mul(vf g, vf u) { return vmul(vdiv(g, vadd(vset1(1.0f), vexp(vsub(vzero(), g)))), u); }

}  // namespace

extern "C" {

// Layers [0, n_layers) of `layers` over hidden[q, E] (in place), the rows at positions past .. past+q-1.
// cos/sin: the rotary table's rows for those positions ([q, D]). Each layer's cache must hold past
// positions and room for q more (the caller grows it first).
void hispec_q4_layers(const hispec_layer *layers, int64_t n_layers, const hispec_dims *dims, float *hidden, int64_t q,
                      int64_t past, const float *cos, const float *sin, int nthreads) {
    const int64_t E = dims->hidden, H = dims->heads, KV = dims->kv_heads, D = dims->head_dim, I = dims->inter;
    const int64_t NQKV = (H + 2 * KV) * D, total = past + q, group = H / KV;
    float *qkv = (float *)malloc(sizeof(float) * q * NQKV);
    float *attn = (float *)malloc(sizeof(float) * q * H * D);
    float *tmp = (float *)malloc(sizeof(float) * q * (E > I ? E : I));  // product outputs before the residual
    float *act = (float *)malloc(sizeof(float) * q * I);
    const bool prof = g_prof_on != 0;
#pragma omp parallel num_threads(nthreads)
    {
        int64_t maxk = E > I ? E : I;
        maxk = maxk > H * D ? maxk : H * D;  // the widest row a product takes (attention rows: H * D)
        float *xn = (float *)malloc(sizeof(float) * q * maxk);  // this thread's normed rows
        float *sx = (float *)malloc(sizeof(float) * q * (maxk / QK + 1));
        float *scores = (float *)malloc(sizeof(float) * (total + 2 * D));
        const bool act8 = dims->act8 != 0;  // each thread quantises every row into its own buffers
        int8_t *xq = act8 ? (int8_t *)malloc(q * maxk) : nullptr;
        float *dxe = act8 ? (float *)malloc(sizeof(float) * q * dxe_len(maxk / QK)) : nullptr;
        float *rot = scores + total;  // D floats of scratch (rotary), D more (attention accumulators)
        const bool lead = omp_get_thread_num() == 0;
        double t0 = prof && lead ? now() : 0;
        auto mark = [&](int phase) {
            if (prof && lead) {
                double t = now();
                g_prof[phase] += t - t0;
                t0 = t;
            }
        };
        for (int64_t l = 0; l < n_layers; l++) {
            const hispec_layer &L = layers[l];
            // 1. input norm (every thread, all rows) and the fused q/k/v product (columns split)
            for (int64_t r = 0; r < q; r++) rms_norm_row(hidden + r * E, L.in_norm, E, dims->eps, xn + r * E);
            block_sums_rows(xn, q, E, sx);
            if (act8) quantize_rows(xn, q, E, xq, dxe);
            mark(2);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < ntasks(NQKV); t++) {
                int64_t n0 = t * COLS_PER_TASK, n1 = n0 + COLS_PER_TASK < NQKV ? n0 + COLS_PER_TASK : NQKV;
                product(act8, xn, xq, dxe, q, sx, L.qkv, n0, n1, qkv, NQKV);
                if (L.qkv_bias)
                    for (int64_t r = 0; r < q; r++)
                        for (int64_t n = n0; n < n1; n++) qkv[r * NQKV + n] = qkv[r * NQKV + n] + L.qkv_bias[n];
            }
            mark(0);
            // 2. per-head norms (Qwen3), rotary, keys and values into the cache
#pragma omp for schedule(static)
            for (int64_t u = 0; u < q * (H + KV); u++) {
                int64_t r = u / (H + KV), hd = u % (H + KV);
                float *x = qkv + r * NQKV + hd * D;
                const float *nw = hd < H ? L.q_norm : L.k_norm;
                if (nw) rms_norm_row(x, nw, D, dims->qk_eps, x);
                rotate_head(x, cos + r * D, sin + r * D, D, rot);
                if (hd >= H) {
                    int64_t g = hd - H, pos = past + r;
                    memcpy(L.keys + (g * L.cap + pos) * D, x, sizeof(float) * D);
                    memcpy(L.values + (g * L.cap + pos) * D, qkv + r * NQKV + (H + KV + g) * D, sizeof(float) * D);
                }
            }
            mark(1);
            // 3. attention: each (row, head) on one thread, over cache positions [0, pos]
#pragma omp for schedule(static)
            for (int64_t u = 0; u < q * H; u++) {
                int64_t r = u / H, h = u % H, g = h / group, n = past + r + 1;
                const float *qv = qkv + r * NQKV + h * D;
                const float *K = L.keys + g * L.cap * D, *V = L.values + g * L.cap * D;
                float mx = -INFINITY;
                for (int64_t j = 0; j < n; j++) {
                    float s = dot(qv, K + j * D, D) * dims->scaling;
                    scores[j] = s;
                    mx = s > mx ? s : mx;
                }
                // e_j = exp(s_j - max); their sum: VL lanes over whole vectors of j, the lanes' tree, then
                // the tail in order (an order fixed by n alone)
                for (int64_t j = 0; j < n; j++) scores[j] = scores[j] - mx;
                exp_n(scores, scores, n);
                vf vs = vzero();
                int64_t j0 = 0;
                for (; j0 + VL <= n; j0 += VL) vs = vadd(vs, vload(scores + j0));
                float sum = vsum(vs);
                for (; j0 < n; j0++) sum = sum + scores[j0];
                float *out = attn + r * H * D + h * D;
                const vf inv = vset1(1.0f / sum);
                if (D % VL == 0 && D / VL <= 16) {  // every feature's chain over j at once
                    const int64_t nv = D / VL;
                    vf acc[16];
                    for (int64_t c = 0; c < nv; c++) acc[c] = vzero();
                    for (int64_t j = 0; j < n; j++) {
                        vf e = vset1(scores[j]);
                        for (int64_t c = 0; c < nv; c++) acc[c] = vfma(e, vload(V + j * D + c * VL), acc[c]);
                    }
                    for (int64_t c = 0; c < nv; c++) vstore(out + c * VL, vmul(acc[c], inv));
                } else {
                    for (int64_t i = 0; i < D; i++) {
                        float acc = 0.0f;
                        for (int64_t j = 0; j < n; j++) acc = fmaf(scores[j], V[j * D + i], acc);
                        out[i] = acc * (1.0f / sum);
                    }
                }
            }
            mark(1);
            // 4. o_proj + residual
            block_sums_rows(attn, q, H * D, sx);
            if (act8) quantize_rows(attn, q, H * D, xq, dxe);
            mark(2);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < ntasks(E); t++) {
                int64_t n0 = t * COLS_PER_TASK, n1 = n0 + COLS_PER_TASK < E ? n0 + COLS_PER_TASK : E;
                product(act8, attn, xq, dxe, q, sx, L.o, n0, n1, tmp, E);
                for (int64_t r = 0; r < q; r++)
                    for (int64_t n = n0; n < n1; n++) {
                        float y = tmp[r * E + n];
                        if (L.o_bias) y = y + L.o_bias[n];
                        hidden[r * E + n] = hidden[r * E + n] + y;
                    }
            }
            mark(0);
            // 5. post norm, gate and up (a task computes the same columns of both), SiLU(gate) * up
            for (int64_t r = 0; r < q; r++) rms_norm_row(hidden + r * E, L.post_norm, E, dims->eps, xn + r * E);
            block_sums_rows(xn, q, E, sx);
            if (act8) quantize_rows(xn, q, E, xq, dxe);
            mark(2);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < ntasks(I); t++) {
                int64_t n0 = t * COLS_PER_TASK, n1 = n0 + COLS_PER_TASK < I ? n0 + COLS_PER_TASK : I;
                // gate columns into tmp[:, n], up columns into act[:, n] (row stride I each)
                product(act8, xn, xq, dxe, q, sx, L.gate_up, n0, n1, tmp, I);
                Mat up = L.gate_up;
                up.qs += I * (up.K / 2);
                up.d += I * (up.K / QK);
                up.m += I * (up.K / QK);
                product(act8, xn, xq, dxe, q, sx, up, n0, n1, act, I);
                for (int64_t r = 0; r < q; r++) {  // n1 - n0 = 32 (the intermediate size is whole blocks)
                    if (L.gate_up_bias)
                        for (int64_t n = n0; n < n1; n++) {
                            tmp[r * I + n] = tmp[r * I + n] + L.gate_up_bias[n];
                            act[r * I + n] = act[r * I + n] + L.gate_up_bias[I + n];
                        }
                    for (int64_t n = n0; n < n1; n += VL)
                        vstore(act + r * I + n, vsilu_mul(vload(tmp + r * I + n), vload(act + r * I + n)));
                }
            }
            mark(0);
            // 6. down + residual
            block_sums_rows(act, q, I, sx);
            if (act8) quantize_rows(act, q, I, xq, dxe);
            mark(2);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < ntasks(E); t++) {
                int64_t n0 = t * COLS_PER_TASK, n1 = n0 + COLS_PER_TASK < E ? n0 + COLS_PER_TASK : E;
                product(act8, act, xq, dxe, q, sx, L.down, n0, n1, tmp, E);
                for (int64_t r = 0; r < q; r++)
                    for (int64_t n = n0; n < n1; n++) {
                        float y = tmp[r * E + n];
                        if (L.down_bias) y = y + L.down_bias[n];
                        hidden[r * E + n] = hidden[r * E + n] + y;
                    }
            }
            mark(0);
        }
        free(xn);
        free(sx);
        free(scores);
        free(xq);
        free(dxe);
    }
    free(qkv);
    free(attn);
    free(tmp);
    free(act);
}

// Phase clock of hispec_q4_layers (thread 0, from barrier to barrier): [0] products, [1] attention
// with rotary and cache writes, [2] norms and block sums. mode 0 off, 1 wall, 2 thread CPU time, -1
// unchanged; reset zeroes it; out (if not null) receives the 8 accumulators first.
void hispec_q4_profile(int mode, int reset, double *out) {
    if (out) memcpy(out, g_prof, sizeof(g_prof));
    if (reset) memset(g_prof, 0, sizeof(g_prof));
    if (mode >= 0) g_prof_on = mode;
}

}  // extern "C"
