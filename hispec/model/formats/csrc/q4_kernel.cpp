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
//
// The wide arithmetic (WIDE = true: the exact float32 lane on the file's blocks, ``hispec_q4*_matmul_w``
// and hispec_q4_layers' mode 2): each weight is widened in registers to w = fma(d_b, q, m_b) (Q8_0:
// d_b * q), which is exactly the float32 value of the dequantised model (d * q is exact in float32, so
// the one rounding of d * q + m is the fma's); then, per output element and block b in order,
//     AVX-512: acc = fma(w_16..31, x_16..31, fma(w_0..15, x_0..15, acc))   (block_step says why)
//     AVX2:    t_b = sum_i w_i * x_i   lane by lane (a product and FMAs);   acc = acc + t_b
// and the lanes' fixed tree at the end. So it computes the dot products of the float32 model with the
// float32 model's very weights, in an order of its own (not oneDNN's), reading 4.5 bits per weight
// instead of 32. A block is widened once per tile of rows, so a k-row pass costs little more per row
// than the 4-bit arithmetic.
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
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

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
// WIDE: the weights widened to their float32 values first (the header's wide arithmetic).
template <class W>
inline __attribute__((always_inline)) void widen(const W &w, int64_t n, int64_t b, vf dv, vf q[NV]) {
    if constexpr (W::has_min) {
        vf mv = vset1(half(w.m[n * w.nb + b]));
        for (int j = 0; j < NV; j++) q[j] = vfma(dv, q[j], mv);
    } else {
        for (int j = 0; j < NV; j++) q[j] = vmul(dv, q[j]);
    }
}

// One block of one element: acc gains q_b . x_b (q widened or not). The 4-bit arithmetic sums the block
// first, t = q_0 x_0 + q_1 x_1 (...), then acc = fma(d_b, t, acc). The wide arithmetic on the AVX-512 build
// (two vectors a block) chains the block's FMAs into the accumulator, acc = fma(w_1, x_1, fma(w_0, x_0, acc)):
// two operations a vector pair where a block sum and an add took three, and a k-row pass is bound by these
// operations (about one 512-bit FMA a cycle a core on this project's Xeons; the default model's float32
// pass: assets/bench/q4_ab_wide_fma_avx512.json, docs/precision.md's block "wide-fma"). On the
// AVX2 build (four vectors a block) the chain would be twice as long per lane, and its rounding drifted past
// the wide product's test tolerance, so there the block is summed first as before. The order stays fixed by
// the block and lane layout alone: still batch-invariant.
template <bool WIDE>
inline __attribute__((always_inline)) void block_step(const vf q[NV], vf dv, const float *xr, vf &acc) {
    if constexpr (WIDE && NV == 2) {
        acc = vfma(q[0], vload(xr), acc);
        acc = vfma(q[1], vload(xr + VL), acc);
    } else {
        vf t = vmul(q[0], vload(xr));
        for (int j = 1; j < NV; j++) t = vfma(q[j], vload(xr + j * VL), t);
        acc = WIDE ? vadd(acc, t) : vfma(dv, t, acc);
    }
}

template <int R, class W, bool WIDE>
inline __attribute__((always_inline)) void column(const float *x, int64_t ldx, const float *sx, const W &w, int64_t n,
                                                  float *out, int64_t ldo) {
    vf acc[R];
    for (int r = 0; r < R; r++) acc[r] = vzero();
    for (int64_t b = 0; b < w.nb; b++) {
        vf q[NV];
        w.values(n, b, q);
        vf dv = vset1(half(w.d[n * w.nb + b]));
        if constexpr (WIDE) widen(w, n, b, dv, q);
        const float *xb = x + b * QK;
        for (int r = 0; r < R; r++) {
            const float *xr = xb + r * ldx;
            block_step<WIDE>(q, dv, xr, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        float total = vsum(acc[r]);
        if constexpr (W::has_min && !WIDE) total = total + min_term(w.m + n * w.nb, sx + r * w.nb, w.nb);
        out[r * ldo + n] = total;
    }
}

// C columns n .. n + C - 1 at once: each column's arithmetic is exactly column<R>'s (the same operations
// in the same order on the same values, so the same bits); interleaving C independent accumulator
// chains only lets the core overlap them (one column's chain of block FMAs is latency-bound).
template <int R, int C, class W, bool WIDE>
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
            if constexpr (WIDE) widen(w, n + c, b, dv, q);
            for (int r = 0; r < R; r++) {
                const float *xr = xb + r * ldx;
                block_step<WIDE>(q, dv, xr, acc[c][r]);
            }
        }
    }
    for (int c = 0; c < C; c++)
        for (int r = 0; r < R; r++) {
            float total = vsum(acc[c][r]);
            if constexpr (W::has_min && !WIDE) total = total + min_term(w.m + (n + c) * w.nb, sx + r * w.nb, w.nb);
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
template <int R, class W, bool WIDE>
void columns(const float *x, int64_t ldx, const float *sx, const W &w, int64_t n0, int64_t n1, float *out,
             int64_t ldo) {
    constexpr int C = R <= 2 ? 4 : R <= 4 ? 2 : 1;
    int64_t n = n0;
    for (; n + C <= n1; n += C) {
        for (int c = 0; c < C; c++) prefetch_column(w, n + C + c);  // the next group's columns
        column_group<R, C, W, WIDE>(x, ldx, sx, w, n, out, ldo);
    }
    for (; n < n1; n++) column<R, W, WIDE>(x, ldx, sx, w, n, out, ldo);
}

// Rows per tile: the wide arithmetic widens a block once per tile (a multiply-add per vector), so it takes
// 8 rows a tile on both builds; tiles decide only which rows share a widened block, never a row's sums.
constexpr int tile_rows(bool wide) { return wide ? 8 : ROWS; }

template <class W, bool WIDE = false>
void rows_tile(int R, const float *x, int64_t ldx, const float *sx, const W &w, int64_t n0, int64_t n1, float *out,
               int64_t ldo) {
    switch (R) {
    case 1: columns<1, W, WIDE>(x, ldx, sx, w, n0, n1, out, ldo); break;
    case 2: columns<2, W, WIDE>(x, ldx, sx, w, n0, n1, out, ldo); break;
    case 3: columns<3, W, WIDE>(x, ldx, sx, w, n0, n1, out, ldo); break;
    case 4: columns<4, W, WIDE>(x, ldx, sx, w, n0, n1, out, ldo); break;
    default:
        constexpr int T = tile_rows(WIDE);
        if constexpr (T > 4) {
            switch (R) {
            case 5: columns<5 <= T ? 5 : 1, W, WIDE>(x, ldx, sx, w, n0, n1, out, ldo); break;
            case 6: columns<6 <= T ? 6 : 1, W, WIDE>(x, ldx, sx, w, n0, n1, out, ldo); break;
            case 7: columns<7 <= T ? 7 : 1, W, WIDE>(x, ldx, sx, w, n0, n1, out, ldo); break;
            case 8: columns<8 <= T ? 8 : 1, W, WIDE>(x, ldx, sx, w, n0, n1, out, ldo); break;
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

// ---- the kernel's own thread pool ---------------------------------------------------------------------------
// One pool for the process, its workers started at first use. A call (`Pool::run`) runs fn(tid) on n threads,
// the caller being tid 0; calls from several threads take turns (one at a time: each uses every core). Inside a
// call the threads meet at spinning barriers; between calls a worker spins a little (SPIN_IDLE pauses, about a
// tenth of a millisecond: a spinning worker takes a core from the Python threads that prepare the next pass) and
// then sleeps on a condition variable, so a call pays one wake-up at most, never one per barrier.
// Why not OpenMP: libgomp shortens its spin to a hundred iterations as soon as the process has more OpenMP
// threads than cores (every Python thread that ran a torch operation owns a team), and a decoder pass meets
// at about two hundred barriers; each then cost a futex sleep and wake-up (measured on a 2-core host: a one-row
// int8-activation pass 12.7 ms with libgomp's throttled barriers, 3.9 ms when its threads spun). Which thread
// computes which column never changes a bit (the header above): the schedule is free to change.
constexpr int SPIN_IDLE = 2000;  // pauses a worker spins for the next call before it sleeps
constexpr int SPIN_YIELD = 4000;  // pauses at a barrier before each yield (a core may be lent to another thread)

inline void relax() { _mm_pause(); }

class Pool {
  public:
    template <class F>
    void run(int n, F &&fn) {
        std::lock_guard<std::mutex> turn(run_lock_);
        if (n > 1) grow(n - 1);
        n = n < 1 ? 1 : n > 1 + (int)workers_.size() ? 1 + (int)workers_.size() : n;
        if (n == 1) {
            active_ = 1;
            fn(0);
            return;
        }
        ctx_ = (void *)&fn;
        call_ = [](void *ctx, int tid) { (*(F *)ctx)(tid); };
        active_ = n;
        count_.store(0, std::memory_order_relaxed);
        done_.store(0, std::memory_order_relaxed);
        {
            std::lock_guard<std::mutex> lk(m_);
            gen_.fetch_add(1, std::memory_order_release);
        }
        cv_.notify_all();
        fn(0);
        const int others = (int)workers_.size();
        for (int spins = 0; done_.load(std::memory_order_acquire) < others; spins++) {
            relax();
            if (spins % SPIN_YIELD == SPIN_YIELD - 1) sched_yield();
        }
    }

    // The threads of the running call meet here (tid < n only).
    void barrier() {
        if (active_ <= 1) return;
        const int phase = phase_.load(std::memory_order_acquire);
        if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == active_) {
            count_.store(0, std::memory_order_relaxed);
            phase_.store(phase + 1, std::memory_order_release);
            return;
        }
        for (int spins = 0; phase_.load(std::memory_order_acquire) == phase; spins++) {
            relax();
            if (spins % SPIN_YIELD == SPIN_YIELD - 1) sched_yield();
        }
    }

    int active() const { return active_; }

  private:
    void grow(int want) {
        while ((int)workers_.size() < want) {
            int tid = 1 + (int)workers_.size();
            // the call it must take part in next is the one after this generation (read before run() moves it on)
            uint64_t seen = gen_.load(std::memory_order_acquire);
            workers_.emplace_back([this, tid, seen] { work(tid, seen); });
            workers_.back().detach();  // lives as long as the process (never joined: no exit-time teardown)
        }
    }

    void work(int tid, uint64_t seen) {
        for (;;) {
            int spins = 0;
            while (gen_.load(std::memory_order_acquire) == seen) {
                if (++spins < SPIN_IDLE) {
                    relax();
                    continue;
                }
                std::unique_lock<std::mutex> lk(m_);
                cv_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen; });
            }
            seen = gen_.load(std::memory_order_acquire);
            if (tid < active_) call_(ctx_, tid);
            done_.fetch_add(1, std::memory_order_acq_rel);
        }
    }

    std::mutex run_lock_, m_;
    std::condition_variable cv_;
    std::vector<std::thread> workers_;
    std::atomic<uint64_t> gen_{0};
    std::atomic<int> done_{0}, count_{0}, phase_{0};
    int active_ = 1;
    void *ctx_ = nullptr;
    void (*call_)(void *, int) = nullptr;
};

Pool *g_pool = nullptr;  // never destroyed: its detached workers outlive every static destructor
std::once_flag g_pool_once;

Pool &pool() {
    std::call_once(g_pool_once, [] {
        g_pool = new Pool();
        // a forked child has none of the parent's workers: it starts a pool of its own at its first call
        pthread_atfork(nullptr, nullptr, [] { g_pool = new Pool(); });
    });
    return *g_pool;
}

// Iterations [0, N) of a static schedule: thread tid of n gets one contiguous chunk (the first N % n one more).
inline void chunk(int64_t N, int tid, int n, int64_t &lo, int64_t &hi) {
    int64_t q = N / n, r = N % n;
    lo = tid * q + (tid < r ? tid : r);
    hi = lo + q + (tid < r ? 1 : 0);
}

// for t in [0, N): fn(t), split over the pool's threads (one call, no barrier needed after it: run returns
// when every thread is done).
template <class F>
void parallel_for(int64_t N, int nthreads, F &&fn) {
    int n = nthreads > 1 && N > 1 ? nthreads : 1;
    pool().run(n, [&](int tid) {
        int64_t lo, hi;
        chunk(N, tid, pool().active(), lo, hi);
        for (int64_t t = lo; t < hi; t++) fn(t);
    });
}


template <class W, bool WIDE = false>
void matmul(const float *x, int64_t M, int64_t K, const W &w, int64_t N, float *out, int64_t ldo, int nthreads) {
    int64_t nb = K / QK;
    float local[16 * 64];
    float *sx = nullptr;
    if (W::has_min && !WIDE) {
        sx = M * nb <= 16 * 64 ? local : (float *)malloc(sizeof(float) * M * nb);
        block_sums(x, M, K, sx);
    }
    int64_t tasks = (N + COLS_PER_TASK - 1) / COLS_PER_TASK;
    parallel_for(tasks, nthreads, [&](int64_t t) {
        int64_t n0 = t * COLS_PER_TASK, n1 = n0 + COLS_PER_TASK < N ? n0 + COLS_PER_TASK : N;
        for (int64_t r0 = 0; r0 < M; r0 += tile_rows(WIDE)) {
            int R = (int)(M - r0 < tile_rows(WIDE) ? M - r0 : tile_rows(WIDE));
            rows_tile<W, WIDE>(R, x + r0 * K, K, sx ? sx + r0 * nb : nullptr, w, n0, n1, out + r0 * ldo, ldo);
        }
    });
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

// The same products in the wide arithmetic (the float32 model's weights widened in registers; header).
void hispec_q41_matmul_w(const float *x, int64_t M, int64_t K, const uint8_t *qs, const uint16_t *d,
                         const uint16_t *m, int64_t N, float *out, int64_t ldo, int nthreads) {
    Q41 w{qs, d, m, K / QK};
    matmul<Q41, true>(x, M, K, w, N, out, ldo, nthreads);
}

void hispec_q80_matmul_w(const float *x, int64_t M, int64_t K, const int8_t *qs, const uint16_t *d, int64_t N,
                         float *out, int64_t ldo, int nthreads) {
    Q80 w{qs, d, nullptr, K / QK};
    matmul<Q80, true>(x, M, K, w, N, out, ldo, nthreads);
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
// int8 activations (the 'a8' precision level: the same Q4_1 weights, integer dot products). Each row of
// x is quantised on its own per block of 32, as llama.cpp quantises for Q4_1 x Q8_1: dx_b = amax_b / 127,
// xq_i = round(x_i * 127 / amax_b) in int8 (round half to even, clamped to +-127; an all-zero block gets
// dx_b = 0 and xq = 0). Per output element and block b, the 32 products q_i * xq_i are summed exactly in
// integers, S_b; then, blocks in order, one float accumulator per element:
//     acc = fma(float(S_b), d_b * dx_b, acc);  acc = fma(m_b, sx_b, acc)
// where sx_b is the float sum of the row's unquantised block (its minimum term: more accurate than
// llama.cpp's dx_b * sum(xq_b)). float(S_b) is exact (|S_b| <= 32 * 15 * 127), so the integer part's
// order is free (any split of the 32 products gives the same integer); the float part is a fixed chain
// over b per element. Nothing in it depends on the other rows of the pass, the tile a row falls in or
// the thread that runs it: the product is batch-invariant by construction, one code path for 1 row and
// for 16 (tiles of rows only decide which rows share an unpacked block).
//
// The k-token pass: lanes are output columns, not weights. The weights are repacked once (at load) in
// groups of G = VL columns: per group and block, 4 vectors of G lanes x 4 bytes (lane j: bytes 4k..4k+3
// of column j's block, i.e. weights 4k..4k+3 in the low nibbles and 16+4k..16+4k+3 in the high ones),
// then the G columns' d and m as float16. Unpacking one block for G columns (3 operations per vector)
// serves every row of the pass; per row and block, 8 dot products of 4 bytes (dpbusd with the row's 4
// activations broadcast; without VNNI maddubs summed in int16, which cannot overflow: 8 x 2 x 15 x 127
// < 32767, then madd) give S_b for all G columns at once, then 4 float operations. The packed bytes are
// exactly the file's (20 per 32 weights), so a 1-row pass reads what the float route reads.
// ==================================================================================================

namespace {

constexpr int64_t G8 = VL;                      // columns per packed group
constexpr int64_t REC = G8 * 20;                // bytes per group and block: 16 G nibbles, G d, G m
constexpr int A8_ROWS = VL == 16 ? 16 : 4;      // rows per tile (registers)

inline int64_t a8_groups(int64_t N) { return (N + G8 - 1) / G8; }
inline int64_t a8_packed_bytes(int64_t N, int64_t K) { return a8_groups(N) * (K / QK) * REC; }

// Q4_1 [N, K] -> the packed groups (columns past N in the last group: zero weights, d = m = 0)
void pack_a8(const uint8_t *qs, const uint16_t *d, const uint16_t *m, int64_t N, int64_t K, uint8_t *out) {
    const int64_t nb = K / QK;
    memset(out, 0, a8_packed_bytes(N, K));
    for (int64_t g = 0; g < a8_groups(N); g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *rec = out + (g * nb + b) * REC;
            for (int64_t j = 0; j < G8 && g * G8 + j < N; j++) {
                const int64_t n = g * G8 + j;
                const uint8_t *src = qs + (n * nb + b) * (QK / 2);
                for (int k = 0; k < 4; k++) memcpy(rec + (k * G8 + j) * 4, src + 4 * k, 4);
                memcpy(rec + 16 * G8 + 2 * j, d + n * nb + b, 2);
                memcpy(rec + 18 * G8 + 2 * j, m + n * nb + b, 2);
            }
        }
}

// Lane by lane, exactly the scalar definition: amax (a max: order-free), then xq_i = lrintf(x_i * id)
// (cvtps rounds half to even, as lrintf in the default mode), clamped to +-127, then narrowed to bytes in
// registers (exact: every value is already within +-127).
inline void quantize_row(const float *x, int64_t K, int8_t *xq, float *dx) {
    for (int64_t b = 0; b < K / QK; b++) {
        const float *p = x + b * QK;
        vf mx = vzero();
        for (int j = 0; j < NV; j++) {
            vf v = vload(p + j * VL);
            mx = vmax(mx, vmax(v, vsub(vzero(), v)));
        }
#if defined(__AVX512F__) && defined(__AVX512BW__)
        const float amax = _mm512_reduce_max_ps(mx);
#else
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
#endif
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
#if defined(__AVX512F__) && defined(__AVX512BW__)
        for (int j = 0; j < NV; j++) {
            __m512i v = _mm512_cvtps_epi32(vmul(vload(p + j * VL), vset1(id)));
            v = _mm512_max_epi32(_mm512_min_epi32(v, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
            _mm_storeu_si128((__m128i *)(xq + b * QK + j * VL), _mm512_cvtepi32_epi8(v));
        }
#else
        __m256i v[NV];
        for (int j = 0; j < NV; j++) {
            v[j] = _mm256_cvtps_epi32(vmul(vload(p + j * VL), vset1(id)));
            v[j] = _mm256_max_epi32(_mm256_min_epi32(v[j], _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
        }
        // packs interleave the 128-bit halves: bytes come out as quads 0,2,4,6 | 1,3,5,7 of 8; the
        // permutation puts them back in order
        const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        _mm256_storeu_si256((__m256i *)(xq + b * QK),
                            _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#endif
        dx[b] = amax / 127.0f;
    }
}

inline void quantize_rows(const float *x, int64_t M, int64_t K, int8_t *xq, float *dx) {
    for (int64_t r = 0; r < M; r++) quantize_row(x + r * K, K, xq + r * K, dx + r * (K / QK));
}

inline int32_t quad(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
typedef __m512i vi;
inline vi vi_load(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }
inline vi vi_low4(vi v) { return _mm512_and_si512(v, _mm512_set1_epi8(15)); }
inline vi vi_high4(vi v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15)); }
inline vf half_lanes(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
inline vf vi_float(vi s) { return _mm512_cvtepi32_ps(s); }
inline vi vi_set1(int32_t a) { return _mm512_set1_epi32(a); }
inline vi vi_maddubs(vi u, vi s) { return _mm512_maddubs_epi16(u, s); }  // u8 x s8, adjacent pairs into 16 bits
inline vi vi_add16(vi a, vi b) { return _mm512_add_epi16(a, b); }
inline vi vi_pairs32(vi a) { return _mm512_madd_epi16(a, _mm512_set1_epi16(1)); }  // adjacent 16-bit pairs into 32
#if defined(__AVX512VNNI__)
// S (32-bit lanes) = sum over the 8 vectors w[k] of each lane's 4 u8 x s8 products with the row's quads.
// Integer sums: any grouping gives the same S; `two_chains` only sets how many dependency chains overlap (two
// where few rows share a block, one where the rows' own chains already keep the unit busy).
template <bool two_chains>
inline vi block_dot(const vi w[8], const int8_t *x) {
    if constexpr (two_chains) {
        vi s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_set1_epi32(quad(x)));
        vi s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[4], _mm512_set1_epi32(quad(x + 16)));
        for (int k = 1; k < 4; k++) {
            s0 = _mm512_dpbusd_epi32(s0, w[k], _mm512_set1_epi32(quad(x + 4 * k)));
            s1 = _mm512_dpbusd_epi32(s1, w[4 + k], _mm512_set1_epi32(quad(x + 16 + 4 * k)));
        }
        return _mm512_add_epi32(s0, s1);
    }
    vi s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_set1_epi32(quad(x)));
    for (int k = 1; k < 8; k++) s = _mm512_dpbusd_epi32(s, w[k], _mm512_set1_epi32(quad(x + 4 * k)));
    return s;
}
#else
#define HISPEC_A8_MADDUBS 1
#endif
#else
typedef __m256i vi;
inline vi vi_load(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
inline vi vi_low4(vi v) { return _mm256_and_si256(v, _mm256_set1_epi8(15)); }
inline vi vi_high4(vi v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15)); }
inline vf half_lanes(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
inline vf vi_float(vi s) { return _mm256_cvtepi32_ps(s); }
inline vi vi_set1(int32_t a) { return _mm256_set1_epi32(a); }
inline vi vi_maddubs(vi u, vi s) { return _mm256_maddubs_epi16(u, s); }
inline vi vi_add16(vi a, vi b) { return _mm256_add_epi16(a, b); }
inline vi vi_pairs32(vi a) { return _mm256_madd_epi16(a, _mm256_set1_epi16(1)); }
#define HISPEC_A8_MADDUBS 1
#endif

#if defined(HISPEC_A8_MADDUBS)
// Without VNNI: maddubs pairs summed in 16 bits (8 x 2 x 15 x 127 < 32767: no overflow), then into 32.
template <bool>
inline vi block_dot(const vi w[8], const int8_t *x) {
    vi s = vi_maddubs(w[0], vi_set1(quad(x)));
    for (int k = 1; k < 8; k++) s = vi_add16(s, vi_maddubs(w[k], vi_set1(quad(x + 4 * k))));
    return vi_pairs32(s);
}
#endif

// ---- the LM head in the same arithmetic: Q8_0 weights (signed bytes w, a float16 scale d per block) ----
// S_b = sum_i w_i * xq_i exactly in integers; acc = fma(float(S_b), d_b * dx_b, acc), blocks in order.
// dpbusd multiplies unsigned by signed bytes, so it takes w + 128 and the row's block sum of xq times 128
// is taken off (|S| < 2^24: float(S_b) exact); without VNNI, |w| times xq with w's sign (maddubs pairs
// stay below 2 x 128 x 127 < 32767), then madd, summed in 32 bits. Packed like Q4_1: per group of G
// columns and block, 8 vectors of G lanes x 4 bytes (lane j: bytes 4k..4k+3 of column j's block), then G d.
constexpr int64_t REC8 = G8 * 34;

inline int64_t a8_packed_bytes_q8(int64_t N, int64_t K) { return a8_groups(N) * (K / QK) * REC8; }

void pack_a8_q8(const int8_t *qs, const uint16_t *d, int64_t N, int64_t K, uint8_t *out) {
    const int64_t nb = K / QK;
    memset(out, 0, a8_packed_bytes_q8(N, K));
    for (int64_t g = 0; g < a8_groups(N); g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *rec = out + (g * nb + b) * REC8;
            for (int64_t j = 0; j < G8 && g * G8 + j < N; j++) {
                const int64_t n = g * G8 + j;
                for (int k = 0; k < 8; k++) memcpy(rec + (k * G8 + j) * 4, qs + n * K + b * QK + 4 * k, 4);
                memcpy(rec + 32 * G8 + 2 * j, d + n * nb + b, 2);
            }
        }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
inline vi block_dot_q8(const vi w[8], const int8_t *x, int32_t xsum) {
#if defined(__AVX512VNNI__)
    vi s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (int k = 0; k < 4; k++) {  // w[k] already holds w + 128
        s0 = _mm512_dpbusd_epi32(s0, w[k], _mm512_set1_epi32(quad(x + 4 * k)));
        s1 = _mm512_dpbusd_epi32(s1, w[4 + k], _mm512_set1_epi32(quad(x + 16 + 4 * k)));
    }
    return _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(128 * xsum));
#else
    (void)xsum;
    vi s = _mm512_setzero_si512();
    for (int k = 0; k < 8; k++) {
        vi xv = _mm512_set1_epi32(quad(x + 4 * k));
        xv = _mm512_mask_sub_epi8(xv, _mm512_movepi8_mask(w[k]), _mm512_setzero_si512(), xv);  // x * sign(w)
        s = _mm512_add_epi32(s, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(w[k]), xv),
                                                  _mm512_set1_epi16(1)));
    }
    return s;
#endif
}
inline vi q8_prepare(vi v) {
#if defined(__AVX512VNNI__)
    return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
#else
    return v;
#endif
}
#else
inline vi block_dot_q8(const vi w[8], const int8_t *x, int32_t) {
    vi s = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        const vi xv = _mm256_sign_epi8(_mm256_set1_epi32(quad(x + 4 * k)), w[k]);  // x * sign(w) (0 where w = 0)
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w[k]), xv), _mm256_set1_epi16(1)));
    }
    return s;
}
inline vi q8_prepare(vi v) { return v; }
#endif

// How each packed format's block unpacks and sums (the rest of the arithmetic is shared, group_a8).
struct PackedQ41 {
    static constexpr int64_t rec = REC, d_at = 16 * G8, m_at = 18 * G8;
    static constexpr bool has_min = true;
    static inline void unpack(const uint8_t *r, vi w[8]) {
        for (int k = 0; k < 4; k++) {
            vi v = vi_load(r + k * G8 * 4);
            w[k] = vi_low4(v);
            w[4 + k] = vi_high4(v);
        }
    }
    template <int R>
    static inline vi dot(const vi w[8], const int8_t *x, int32_t) { return block_dot<(R < 4)>(w, x); }
};
struct PackedQ80 {
    static constexpr int64_t rec = REC8, d_at = 32 * G8, m_at = 0;
    static constexpr bool has_min = false;
    static inline void unpack(const uint8_t *r, vi w[8]) {
        for (int k = 0; k < 8; k++) w[k] = q8_prepare(vi_load(r + k * G8 * 4));
    }
    template <int R>
    static inline vi dot(const vi w[8], const int8_t *x, int32_t xsum) { return block_dot_q8(w, x, xsum); }
};

// A tile's quantised rows: row r's int8 values at xq + r * K, its scales dx and block sums sx (float,
// Q4_1's minimum term) and xs (of xq, the Q8_0 head's offset) at r * nb.
struct A8Rows {
    const int8_t *xq;
    const float *dx, *sx;
    const int32_t *xs;
    A8Rows at(int64_t r0, int64_t K) const {
        const int64_t nb = K / QK;
        return {xq + r0 * K, dx + r0 * nb, sx ? sx + r0 * nb : nullptr, xs ? xs + r0 * nb : nullptr};
    }
};

// A packed matrix is one sequential stream (group after group, block after block), read once per tile of
// rows. The hardware prefetcher keeps up with it while a block costs little (one or two rows), but once a
// block's products take longer (about 8 rows on) it fell behind, and the products waited on memory
// instead of overlapping it (an 8-row product from memory cost twice a 4-row one, from L2 about the same).
// So the kernel asks for the stream A8_AHEAD bytes ahead of the block it multiplies. A prefetch changes no
// arithmetic (the same bits, checked) and never faults, past the end of the matrix too. 8 KiB did best of
// 1 to 16 KiB in a microbenchmark not kept; docs/precision.md (a8-stream) has whole steps before and after.
#ifndef HISPEC_A8_AHEAD
#define HISPEC_A8_AHEAD 8192  // -DHISPEC_A8_AHEAD=0 builds it without the prefetch
#endif
constexpr int64_t A8_AHEAD = HISPEC_A8_AHEAD;

// One packed group (G columns) for a tile of R rows; writes `valid` columns of each row to out[r * ldo + j].
template <int R, class P>
inline __attribute__((always_inline)) void group_a8(const A8Rows &x, int64_t K, const uint8_t *pk, float *out,
                                                    int64_t ldo, int64_t valid) {
    const int64_t nb = K / QK;
    vf acc[R];
    for (int r = 0; r < R; r++) acc[r] = vzero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *rec = pk + b * P::rec;
        if constexpr (A8_AHEAD > 0) prefetch_bytes(rec + A8_AHEAD, P::rec);  // the stream ahead (next groups too)
        vi w[8];
        P::unpack(rec, w);
        const vf dw = half_lanes(rec + P::d_at);
        const vf mw = P::has_min ? half_lanes(rec + P::m_at) : vzero();
        for (int r = 0; r < R; r++) {
            const vf s = vi_float(P::template dot<R>(w, x.xq + r * K + b * QK, x.xs ? x.xs[r * nb + b] : 0));
            acc[r] = vfma(s, vmul(dw, vset1(x.dx[r * nb + b])), acc[r]);
            if constexpr (P::has_min) acc[r] = vfma(mw, vset1(x.sx[r * nb + b]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        if (valid == G8) {
            vstore(out + r * ldo, acc[r]);
        } else {
            float tmp[G8];
            vstore(tmp, acc[r]);
            memcpy(out + r * ldo, tmp, sizeof(float) * valid);
        }
    }
}

template <int R, class P>
void groups_a8(const A8Rows &x, int64_t K, const uint8_t *packed, int64_t N, int64_t n0, int64_t n1, float *out,
               int64_t ldo) {
    const int64_t nb = K / QK;
    for (int64_t g = n0 / G8; g * G8 < n1; g++) {
        const int64_t c = g * G8, valid = (N - c < G8 ? N - c : G8);
        group_a8<R, P>(x, K, packed + g * nb * P::rec, out + c, ldo, valid);
    }
}

// Columns [n0, n1) (n0 a multiple of G) of M quantised rows times a packed matrix [N, K] (P: its format),
// rows in tiles of up to A8_ROWS.
template <class P>
void product_cols_a8(const A8Rows &rows, int64_t M, const uint8_t *packed, int64_t N, int64_t K, int64_t n0,
                     int64_t n1, float *out, int64_t ldo) {
    for (int64_t r0 = 0; r0 < M; r0 += A8_ROWS) {
        const int R = (int)(M - r0 < A8_ROWS ? M - r0 : A8_ROWS);
        const A8Rows x = rows.at(r0, K);
        float *o = out + r0 * ldo;
#define HISPEC_A8_CASE(n) \
    case n: groups_a8<(n <= A8_ROWS ? n : 1), P>(x, K, packed, N, n0, n1, o, ldo); break;
        switch (R) {
            HISPEC_A8_CASE(1) HISPEC_A8_CASE(2) HISPEC_A8_CASE(3) HISPEC_A8_CASE(4) HISPEC_A8_CASE(5) HISPEC_A8_CASE(6)
            HISPEC_A8_CASE(7) HISPEC_A8_CASE(8) HISPEC_A8_CASE(9) HISPEC_A8_CASE(10) HISPEC_A8_CASE(11)
            HISPEC_A8_CASE(12) HISPEC_A8_CASE(13) HISPEC_A8_CASE(14) HISPEC_A8_CASE(15) HISPEC_A8_CASE(16)
        }
#undef HISPEC_A8_CASE
    }
}

// x[M, K] (float rows) @ W.T for a packed matrix: each row quantised on its own, with the block sums its
// format needs (float sums of x for Q4_1's minimum term, integer sums of xq for the Q8_0 head's offset),
// then column tasks split over the threads.
template <class P>
void matmul_a8(const float *x, int64_t M, int64_t K, const uint8_t *packed, int64_t N, float *out, int64_t ldo,
               int nthreads) {
    const int64_t nb = K / QK;
    int8_t *xq = (int8_t *)malloc(M * K);
    float *dx = (float *)malloc(sizeof(float) * M * nb);
    float *sx = P::has_min ? (float *)malloc(sizeof(float) * M * nb) : nullptr;
    int32_t *xs = P::has_min ? nullptr : (int32_t *)malloc(sizeof(int32_t) * M * nb);
    quantize_rows(x, M, K, xq, dx);
    if (sx) block_sums(x, M, K, sx);
    for (int64_t i = 0; xs && i < M * nb; i++) {
        int32_t s = 0;
        for (int j = 0; j < QK; j++) s += xq[i * QK + j];
        xs[i] = s;
    }
    const int64_t tasks = (N + COLS_PER_TASK - 1) / COLS_PER_TASK;
    parallel_for(tasks, nthreads, [&](int64_t t) {
        int64_t n0 = t * COLS_PER_TASK, n1 = n0 + COLS_PER_TASK < N ? n0 + COLS_PER_TASK : N;
        product_cols_a8<P>(A8Rows{xq, dx, sx, xs}, M, packed, N, K, n0, n1, out, ldo);
    });
    free(xq);
    free(dx);
    free(sx);
    free(xs);
}

}  // namespace

extern "C" {

// Bytes of a Q4_1 [N, K] matrix packed for the int8-activation products (this build's group width).
int64_t hispec_q41_packed_bytes(int64_t N, int64_t K) { return a8_packed_bytes(N, K); }

void hispec_q41_pack_a8(const uint8_t *qs, const uint16_t *d, const uint16_t *m, int64_t N, int64_t K,
                        uint8_t *out) {
    pack_a8(qs, d, m, N, K, out);
}

// out[M, ldo] (its first N columns) = x[M, K] @ W[N, K].T, W packed (hispec_q41_pack_a8), x quantised to
// int8 per block of 32.
void hispec_q41_matmul_a8p(const float *x, int64_t M, int64_t K, const uint8_t *packed, int64_t N, float *out,
                           int64_t ldo, int nthreads) {
    matmul_a8<PackedQ41>(x, M, K, packed, N, out, ldo, nthreads);
}

// The same from the file's Q4_1 arrays (packed for the call: for tests and one-off products).
void hispec_q41_matmul_a8(const float *x, int64_t M, int64_t K, const uint8_t *qs, const uint16_t *d,
                          const uint16_t *m, int64_t N, float *out, int64_t ldo, int nthreads) {
    uint8_t *packed = (uint8_t *)malloc(a8_packed_bytes(N, K));
    pack_a8(qs, d, m, N, K, packed);
    matmul_a8<PackedQ41>(x, M, K, packed, N, out, ldo, nthreads);
    free(packed);
}

int64_t hispec_q80_packed_bytes(int64_t N, int64_t K) { return a8_packed_bytes_q8(N, K); }

void hispec_q80_pack_a8(const int8_t *qs, const uint16_t *d, int64_t N, int64_t K, uint8_t *out) {
    pack_a8_q8(qs, d, N, K, out);
}

// out[M, ldo] (its first N columns) = x[M, K] @ W[N, K].T, W a Q8_0 matrix packed (hispec_q80_pack_a8),
// x quantised to int8 per block of 32 (the a8 level's LM head).
void hispec_q80_matmul_a8p(const float *x, int64_t M, int64_t K, const uint8_t *packed, int64_t N, float *out,
                           int64_t ldo, int nthreads) {
    matmul_a8<PackedQ80>(x, M, K, packed, N, out, ldo, nthreads);
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
// One call of the kernel's thread pool for the whole range; phases meet at its barriers.
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
    int32_t mode;  // 0: float32 activations, the 4-bit arithmetic ('q4'); 1: int8 activations per block of 32
                   // (the 'a8' level); 2: float32 activations, the wide arithmetic (the exact float32 lane)
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
template <bool WIDE>
inline void product_cols(const float *x, int64_t M, const float *sx, const Mat &w, int64_t n0, int64_t n1, float *out,
                         int64_t ldo) {
    Q41 q{w.qs, w.d, w.m, w.K / QK};
    int64_t nb = w.K / QK;
    for (int64_t r0 = 0; r0 < M; r0 += tile_rows(WIDE)) {
        int R = (int)(M - r0 < tile_rows(WIDE) ? M - r0 : tile_rows(WIDE));
        rows_tile<Q41, WIDE>(R, x + r0 * w.K, w.K, WIDE ? nullptr : sx + r0 * nb, q, n0, n1, out + r0 * ldo, ldo);
    }
}

// product_cols in the layer's mode: 0 the 4-bit arithmetic, 2 the wide one, 1 the int8-activation twin
// over the rows' quantisation (xq, dxe) and the matrix's packing pk (hispec_q41_pack_a8)
inline void product(int mode, const float *x, const int8_t *xq, const float *dxe, int64_t M, const float *sx,
                    const Mat &w, const uint8_t *pk, int64_t n0, int64_t n1, float *out, int64_t ldo) {
    if (mode == 1)
        product_cols_a8<PackedQ41>(A8Rows{xq, dxe, sx, nullptr}, M, pk, w.N, w.K, n0, n1, out, ldo);
    else if (mode == 2)
        product_cols<true>(x, M, sx, w, n0, n1, out, ldo);
    else
        product_cols<false>(x, M, sx, w, n0, n1, out, ldo);
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

// The rows of one pass, each with its own sequence: row r is at position pos[r] of sequence seq[r], whose
// layer l keeps its keys and values in kv[seq[r]][l] (a shared pass carries several generations, each
// with its own cache; the rows of one sequence are its consecutive positions, in order). cos/sin: the
// rotary table, row r reading its row pos[r] - rot0. Everything but attention runs over all rows at once;
// attention reads each row's own sequence's cache, so a row's bits are those it gets alone.
struct hispec_kv {
    float *keys, *values;  // [KV, cap, D]
    int64_t cap;
};

}  // extern "C"

namespace {

void layers_rows(const hispec_layer *layers, int64_t n_layers, const hispec_dims *dims, float *hidden, int64_t q,
                 const int64_t *pos, const int32_t *seq, const hispec_kv *const *kv, const float *cos,
                 const float *sin, int64_t rot0, int nthreads, const uint8_t *const *packed) {
    const int64_t E = dims->hidden, H = dims->heads, KV = dims->kv_heads, D = dims->head_dim, I = dims->inter;
    int64_t total = 0;  // the longest attention span of a row (its position + 1)
    for (int64_t r = 0; r < q; r++) total = pos[r] + 1 > total ? pos[r] + 1 : total;
    const int64_t NQKV = (H + 2 * KV) * D, group = H / KV;
    float *qkv = (float *)malloc(sizeof(float) * q * NQKV);
    float *attn = (float *)malloc(sizeof(float) * q * H * D);
    float *tmp = (float *)malloc(sizeof(float) * q * (E > I ? E : I));  // product outputs before the residual
    float *act = (float *)malloc(sizeof(float) * q * I);
    const bool prof = g_prof_on != 0;
    pool().run(nthreads, [&](int tid) {
        const int threads_ = pool().active();
        int64_t maxk = E > I ? E : I;
        maxk = maxk > H * D ? maxk : H * D;  // the widest row a product takes (attention rows: H * D)
        float *xn = (float *)malloc(sizeof(float) * q * maxk);  // this thread's normed rows
        float *sx = (float *)malloc(sizeof(float) * q * (maxk / QK + 1));
        float *scores = (float *)malloc(sizeof(float) * (total + 2 * D));
        const bool act8 = dims->mode == 1 && packed;  // each thread quantises every row into its own buffers
        const int mode = act8 ? 1 : dims->mode == 2 ? 2 : 0;
        const bool sums = mode != 2;  // block sums: the 4-bit arithmetic's minimum term, a8's too
        int8_t *xq = act8 ? (int8_t *)malloc(q * maxk) : nullptr;
        float *dxe = act8 ? (float *)malloc(sizeof(float) * q * (maxk / QK)) : nullptr;
        float *rot = scores + total;  // D floats of scratch (rotary), D more (attention accumulators)
        const bool lead = tid == 0;
        double t0 = prof && lead ? now() : 0;
        auto mark = [&](int phase) {
            if (prof && lead) {
                double t = now();
                g_prof[phase] += t - t0;
                t0 = t;
            }
        };
        // [0, N) in the static schedule (this thread's contiguous share), then every thread meets the others
        auto each = [&](int64_t N, auto &&fn) {
            int64_t lo, hi;
            chunk(N, tid, threads_, lo, hi);
            for (int64_t t = lo; t < hi; t++) fn(t);
            pool().barrier();
        };
        // x (q rows) @ W.T (+ b) added to the residual stream, columns split: o_proj and down (the rows' block
        // sums or int8 quantisation, sx / xq / dxe, made by the caller for x)
        auto add_product = [&](const float *x, const Mat &w, const uint8_t *pk_w, const float *bias) {
            each(ntasks(E), [&](int64_t t) {
                int64_t n0 = t * COLS_PER_TASK, n1 = n0 + COLS_PER_TASK < E ? n0 + COLS_PER_TASK : E;
                product(mode, x, xq, dxe, q, sx, w, pk_w, n0, n1, tmp, E);
                for (int64_t r = 0; r < q; r++)
                    for (int64_t n = n0; n < n1; n++) {
                        float y = tmp[r * E + n];
                        if (bias) y = y + bias[n];
                        hidden[r * E + n] = hidden[r * E + n] + y;
                    }
            });
        };
        for (int64_t l = 0; l < n_layers; l++) {
            const hispec_layer &L = layers[l];
            const uint8_t *const *pk = act8 ? packed + 4 * l : nullptr;  // qkv, o, gate_up, down
            // 1. input norm (every thread, all rows) and the fused q/k/v product (columns split)
            for (int64_t r = 0; r < q; r++) rms_norm_row(hidden + r * E, L.in_norm, E, dims->eps, xn + r * E);
            if (sums) block_sums_rows(xn, q, E, sx);
            if (act8) quantize_rows(xn, q, E, xq, dxe);
            mark(2);
            each(ntasks(NQKV), [&](int64_t t) {
                int64_t n0 = t * COLS_PER_TASK, n1 = n0 + COLS_PER_TASK < NQKV ? n0 + COLS_PER_TASK : NQKV;
                product(mode, xn, xq, dxe, q, sx, L.qkv, pk ? pk[0] : nullptr, n0, n1, qkv, NQKV);
                if (L.qkv_bias)
                    for (int64_t r = 0; r < q; r++)
                        for (int64_t n = n0; n < n1; n++) qkv[r * NQKV + n] = qkv[r * NQKV + n] + L.qkv_bias[n];
            });
            mark(0);
            // 2. per-head norms (Qwen3), rotary, keys and values into the cache
            each(q * (H + KV), [&](int64_t u) {
                int64_t r = u / (H + KV), hd = u % (H + KV);
                float *x = qkv + r * NQKV + hd * D;
                const float *nw = hd < H ? L.q_norm : L.k_norm;
                if (nw) rms_norm_row(x, nw, D, dims->qk_eps, x);
                rotate_head(x, cos + (pos[r] - rot0) * D, sin + (pos[r] - rot0) * D, D, rot);
                if (hd >= H) {
                    const hispec_kv &C = kv[seq[r]][l];
                    int64_t g = hd - H;
                    memcpy(C.keys + (g * C.cap + pos[r]) * D, x, sizeof(float) * D);
                    memcpy(C.values + (g * C.cap + pos[r]) * D, qkv + r * NQKV + (H + KV + g) * D, sizeof(float) * D);
                }
            });
            mark(1);
            // 3. attention: each (row, head) on one thread, over cache positions [0, pos]
            each(q * H, [&](int64_t u) {
                int64_t r = u / H, h = u % H, g = h / group, n = pos[r] + 1;
                const float *qv = qkv + r * NQKV + h * D;
                const hispec_kv &C = kv[seq[r]][l];
                const float *K = C.keys + g * C.cap * D, *V = C.values + g * C.cap * D;
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
            });
            mark(1);
            // 4. o_proj + residual
            if (sums) block_sums_rows(attn, q, H * D, sx);
            if (act8) quantize_rows(attn, q, H * D, xq, dxe);
            mark(2);
            add_product(attn, L.o, pk ? pk[1] : nullptr, L.o_bias);
            mark(0);
            // 5. post norm, gate and up (a task computes the same columns of both), SiLU(gate) * up
            for (int64_t r = 0; r < q; r++) rms_norm_row(hidden + r * E, L.post_norm, E, dims->eps, xn + r * E);
            if (sums) block_sums_rows(xn, q, E, sx);
            if (act8) quantize_rows(xn, q, E, xq, dxe);
            mark(2);
            each(ntasks(I), [&](int64_t t) {
                int64_t n0 = t * COLS_PER_TASK, n1 = n0 + COLS_PER_TASK < I ? n0 + COLS_PER_TASK : I;
                // gate columns into tmp[:, n], up columns into act[:, n] (row stride I each)
                product(mode, xn, xq, dxe, q, sx, L.gate_up, pk ? pk[2] : nullptr, n0, n1, tmp, I);
                Mat up = L.gate_up;
                up.qs += I * (up.K / 2);
                up.d += I * (up.K / QK);
                up.m += I * (up.K / QK);
                const uint8_t *pk_up = pk ? pk[2] + I * (up.K / QK) * 20 : nullptr;  // I / G whole groups of G
                product(mode, xn, xq, dxe, q, sx, up, pk_up, n0, n1, act, I);
                for (int64_t r = 0; r < q; r++) {  // n1 - n0 = 32 (the intermediate size is whole blocks)
                    if (L.gate_up_bias)
                        for (int64_t n = n0; n < n1; n++) {
                            tmp[r * I + n] = tmp[r * I + n] + L.gate_up_bias[n];
                            act[r * I + n] = act[r * I + n] + L.gate_up_bias[I + n];
                        }
                    for (int64_t n = n0; n < n1; n += VL)
                        vstore(act + r * I + n, vsilu_mul(vload(tmp + r * I + n), vload(act + r * I + n)));
                }
            });
            mark(0);
            // 6. down + residual
            if (sums) block_sums_rows(act, q, I, sx);
            if (act8) quantize_rows(act, q, I, xq, dxe);
            mark(2);
            add_product(act, L.down, pk ? pk[3] : nullptr, L.down_bias);
            mark(0);
        }
        free(xn);
        free(sx);
        free(scores);
        free(xq);
        free(dxe);
    });
    free(qkv);
    free(attn);
    free(tmp);
    free(act);
}

}  // namespace

extern "C" {

// Layers [0, n_layers) of `layers` over hidden[q, E] (in place), the rows of one sequence at positions
// past .. past+q-1, its cache in the layer table (keys, values, cap). cos/sin: the rotary table's rows for
// those positions ([q, D]). Each layer's cache must hold past positions and room for q more (the caller
// grows it first). packed (act8 only, else ignored): per layer the int8 packings of qkv, o, gate_up and
// down (4 pointers a layer; an argument of its own, so that the layer table keeps its layout for builds of
// before it).
void hispec_q4_layers(const hispec_layer *layers, int64_t n_layers, const hispec_dims *dims, float *hidden, int64_t q,
                      int64_t past, const float *cos, const float *sin, int nthreads,
                      const uint8_t *const *packed) {
    int64_t *pos = (int64_t *)malloc(sizeof(int64_t) * (q > 0 ? q : 1));
    int32_t *seq = (int32_t *)calloc(q > 0 ? q : 1, sizeof(int32_t));
    hispec_kv *own = (hispec_kv *)malloc(sizeof(hispec_kv) * (n_layers > 0 ? n_layers : 1));
    for (int64_t r = 0; r < q; r++) pos[r] = past + r;
    for (int64_t l = 0; l < n_layers; l++) own[l] = hispec_kv{layers[l].keys, layers[l].values, layers[l].cap};
    const hispec_kv *kv[1] = {own};
    layers_rows(layers, n_layers, dims, hidden, q, pos, seq, kv, cos, sin, past, nthreads, packed);
    free(pos);
    free(seq);
    free(own);
}

// A shared pass: the rows of several sequences in one call (layers_rows above says how).
void hispec_q4_layers_rows(const hispec_layer *layers, int64_t n_layers, const hispec_dims *dims, float *hidden,
                           int64_t q, const int64_t *pos, const int32_t *seq, const hispec_kv *const *kv,
                           const float *cos, const float *sin, int nthreads, const uint8_t *const *packed) {
    layers_rows(layers, n_layers, dims, hidden, q, pos, seq, kv, cos, sin, 0, nthreads, packed);
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
