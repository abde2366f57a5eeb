/* The two hot loops of _kernels.c, written once for native vectors of H float lanes and included by
 * _kernels.c once per vector width: H = 16 (AVX-512), 8 (AVX2), 4 (SSE2, NEON, and any other build).
 * Before including, _kernels.c defines H, VARIANT(name) (a name suffix per width) and TARGET (the
 * instruction set the functions are compiled for; empty for the portable build); this file undefines
 * them at its end, ready for the next width.
 *
 * Every width does the arithmetic of the same W = 16 logical lanes, each logical vector held as P = W / H
 * native vectors: element i of a step of 2W goes to chain i / W, logical lane i % W, exactly as before the
 * split. With -ffp-contract=off every width therefore gives the same bits. Vectors must not be wider than
 * the hardware's registers: GCC 12 lowers a 64-byte vector on AVX2 or SSE2 into spilled, partly scalar
 * code (measured on an AMD EPYC, AVX2: 1,200-1,600 us per MiB chunk against 58 us with native halves).
 */

#define P (W / H)
#define VF VARIANT(vf)
#define VI VARIANT(vi)
typedef float VF __attribute__((vector_size(H * 4)));
typedef int VI __attribute__((vector_size(H * 4)));
/* mask ? a : b, lane by lane (a macro: vector arguments of a helper would change the ABI per width) */
#define SELECT(mask, a, b) ((VF)(((VI)(a) & (mask)) | ((VI)(b) & ~(mask))))

/* The summary loop, once per source type: float32, and float16 and bfloat16 widened to float32 as they are
 * loaded (the same float32 values, so the same arithmetic and bits as summarising a widened copy). */
#define VH VARIANT(vh)
#define VU VARIANT(vu)
typedef unsigned short VH __attribute__((vector_size(H * 2)));
typedef unsigned int VU __attribute__((vector_size(H * 4)));
/* H bfloat16 values at ptr as float32: the bits shifted into the top half. */
#define BF16_VEC(ptr)                                                                                        \
    ({                                                                                                       \
        VH h_;                                                                                               \
        memcpy(&h_, (ptr), sizeof h_);                                                                       \
        VU r_ = __builtin_convertvector(h_, VU) << 16;                                                       \
        VF f_;                                                                                               \
        memcpy(&f_, &r_, sizeof f_);                                                                         \
        f_;                                                                                                  \
    })
/* H float16 values at ptr as float32: one vcvtph2ps in the AVX-512 and AVX2 (+F16C) builds, elsewhere
 * f16_bits_to_f32_bits (in _kernels.c) lane by lane, as selects (~3x slower). Both exact; a NaN stays NaN. */
#if defined(GT_X86_WIDTHS) && H == 16
#define F16_VEC(ptr) ((VF)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ptr))))
#elif defined(GT_X86_WIDTHS) && H == 8
#define F16_VEC(ptr) ((VF)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ptr))))
#else
#define F16_VEC(ptr)                                                                                         \
    ({                                                                                                       \
        VH h_;                                                                                               \
        memcpy(&h_, (ptr), sizeof h_);                                                                       \
        VU u_ = __builtin_convertvector(h_, VU);                                                             \
        VU o_ = (u_ & 0x7fffu) << 13;                                                                        \
        VU e_ = o_ & (0x7c00u << 13);                                                                        \
        VU normal_ = o_ + ((127u - 15u) << 23);                                                              \
        VU special_ = normal_ + ((128u - 16u) << 23);                                                        \
        VU subbits_ = normal_ + (1u << 23);                                                                  \
        VF sub_;                                                                                             \
        memcpy(&sub_, &subbits_, sizeof sub_);                                                               \
        sub_ -= 6.103515625e-05f;                                                                            \
        memcpy(&subbits_, &sub_, sizeof sub_);                                                               \
        VU isspecial_ = (VU)(e_ == (0x7c00u << 13)), issub_ = (VU)(e_ == 0);                                 \
        VU r_ = (special_ & isspecial_) | (subbits_ & issub_) | (normal_ & ~(isspecial_ | issub_));          \
        r_ |= (u_ & 0x8000u) << 16;                                                                          \
        VF f_;                                                                                               \
        memcpy(&f_, &r_, sizeof f_);                                                                         \
        f_;                                                                                                  \
    })
#endif
#define SUMMARY_NAME VARIANT(f32_summary_loop)
#define SRC_T float
#define LOAD_VEC(dst, ptr) memcpy(&(dst), (ptr), sizeof(dst)) /* unaligned loads */
#define LOAD_ONE(ptr) (*(ptr))
#include "_kernels_summary.h"
#define SUMMARY_NAME VARIANT(bf16_summary_loop)
#define SRC_T unsigned short
#define LOAD_VEC(dst, ptr) ((dst) = BF16_VEC(ptr))
#define LOAD_ONE(ptr) bf16_to_f32(*(ptr))
#include "_kernels_summary.h"
#define SUMMARY_NAME VARIANT(f16_summary_loop)
#define SRC_T unsigned short
#define LOAD_VEC(dst, ptr) ((dst) = F16_VEC(ptr))
#define LOAD_ONE(ptr) f16_to_f32(*(ptr))
#include "_kernels_summary.h"

/* y = x · scale (one float32 multiply per element) and, in the same pass, Σy² with exactly the arithmetic of
 * f32_summary_loop's Σx² (so it has the bits of f32_summary(y)'s), and #changed = #(y != x) - #(x is NaN)
 * (x NaN makes y NaN, which is not a change). Two counters, not one AND of two comparisons: GCC 12 turns
 * that AND into scalar code in the AVX-512 build (measured 25x slower). */
TARGET static void VARIANT(f32_scale_loop)(const float *x, float *y, Py_ssize_t n, float scale,
                                           double *sumsq_out, long long *changed_out) {
    VF sv;
    for (int k = 0; k < H; k++) sv[k] = scale;
    double sumsq[W] = {0};
    long long changed = 0;
    Py_ssize_t i = 0;
    Py_ssize_t vec_end = n - n % (2 * W);
    while (i < vec_end) {
        Py_ssize_t end = i + BLOCK < vec_end ? i + BLOCK : vec_end;
        VF q0[P], q1[P];
        VI c[P];
        for (int p = 0; p < P; p++) {
            q0[p] = q1[p] = (VF){0};
            c[p] = (VI){0};
        }
        for (; i < end; i += 2 * W) {
            for (int p = 0; p < P; p++) {
                VF a, b;
                memcpy(&a, x + i + p * H, sizeof a);
                memcpy(&b, x + i + W + p * H, sizeof b);
                VF oa = a * sv, ob = b * sv;
                memcpy(y + i + p * H, &oa, sizeof oa);
                memcpy(y + i + W + p * H, &ob, sizeof ob);
                c[p] -= (oa != a);
                c[p] += (a != a);
                c[p] -= (ob != b);
                c[p] += (b != b);
                q0[p] += oa * oa;
                q1[p] += ob * ob;
            }
        }
        for (int p = 0; p < P; p++) {
            VF q = q0[p] + q1[p];
            for (int k = 0; k < H; k++) {
                sumsq[p * H + k] += (double)q[k];
                changed += c[p][k];
            }
        }
    }
    double total_sq = 0.0;
    for (int k = 0; k < W / 2; k++) total_sq += sumsq[k] + sumsq[k + W / 2];
    for (; i < n; i++) { /* the tail, in float64, as f32_summary_loop */
        float v = x[i], o = v * scale;
        y[i] = o;
        changed += (o != v) && !(o != o && v != v);
        total_sq += (double)o * (double)o;
    }
    *sumsq_out = total_sq;
    *changed_out = changed;
}

/* dst[i] = src[i] widened to float32 for i < n - n % H (the caller widens the rest): bfloat16 (bf16 != 0) or
 * IEEE float16, with the summary loops' loads. */
TARGET static Py_ssize_t VARIANT(half_to_f32_loop)(const unsigned short *src, float *dst, Py_ssize_t n,
                                                  int bf16) {
    Py_ssize_t i = 0, end = n - n % H;
    for (; i < end; i += H) {
        VF f = bf16 ? BF16_VEC(src + i) : F16_VEC(src + i);
        memcpy(dst + i, &f, sizeof f);
    }
    return end;
}

/* dst[i] = src[i] rounded to bfloat16 (bf16 != 0) or float16 for i < n - n % H (the caller rounds the rest),
 * to nearest even as _kernels.c's f32_bits_to_bf16_bits and f32_bits_to_f16_bits round: float16 by one
 * vcvtps2ph in the AVX-512 and AVX2 (+F16C) builds (returns 0 elsewhere: the scalar function does it all). */
TARGET static Py_ssize_t VARIANT(f32_to_half_loop)(const float *src, unsigned short *dst, Py_ssize_t n,
                                                   int bf16) {
    Py_ssize_t i = 0, end = n - n % H;
    if (bf16) {
        for (; i < end; i += H) {
            VU u;
            memcpy(&u, src + i, sizeof u);
            VU a = u & 0x7fffffffu;
            VU rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
            VU nan = ((u >> 16) & 0x8000u) | 0x7fc0u;
            VU is_nan = (VU)(a > 0x7f800000u);
            VH h = __builtin_convertvector((nan & is_nan) | (rounded & ~is_nan), VH);
            memcpy(dst + i, &h, sizeof h);
        }
        return end;
    }
#if defined(GT_X86_WIDTHS) && H == 16
    for (; i < end; i += H) {
        __m512 v = _mm512_loadu_ps(src + i);
        __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_si256((__m256i *)(dst + i), h);
    }
    return end;
#elif defined(GT_X86_WIDTHS) && H == 8
    for (; i < end; i += H) {
        __m256 v = _mm256_loadu_ps(src + i);
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    return end;
#else
    (void)src;
    (void)dst;
    return 0;
#endif
}

/* H float32 values p rounded to float16 (one vcvtps2ph), stored at dst, and given back widened again: the
 * AVX-512 and AVX2 (+F16C) builds only. */
#if defined(GT_X86_WIDTHS) && H == 16
#define F16_ROUND_STORE(dst, p)                                                                              \
    ({                                                                                                       \
        __m256i h_ = _mm512_cvtps_ph((__m512)(p), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);            \
        _mm256_storeu_si256((__m256i *)(dst), h_);                                                           \
        (VF) _mm512_cvtph_ps(h_);                                                                            \
    })
#elif defined(GT_X86_WIDTHS) && H == 8
#define F16_ROUND_STORE(dst, p)                                                                              \
    ({                                                                                                       \
        __m128i h_ = _mm256_cvtps_ph((__m256)(p), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);            \
        _mm_storeu_si128((__m128i *)(dst), h_);                                                              \
        (VF) _mm256_cvtph_ps(h_);                                                                            \
    })
#endif

/* half_scale's loop: y[i] = round(widen(x[i]) * scale) for i < n - n % H, bfloat16 (bf16 != 0) or float16
 * (the AVX-512 and AVX2 builds; elsewhere 0 is returned and the caller does it all), in registers: the
 * widening loads, one float32 multiply, and the rounding of f32_to_half_loop, so the bits of half_scale's
 * block steps (widen, multiply, round: one pass each over the block). x may be y (each vector is read before
 * its own place is written). Adds to *changed #(widened y != widened x) - #(x is NaN): as floats compare, so
 * +0 and -0 are equal, and NaN to NaN is not a change (x NaN makes y NaN): half_changes' count. Two counters,
 * not one AND of two comparisons (see f32_scale_loop). Returns the elements done. */
TARGET static Py_ssize_t VARIANT(half_scale_loop)(const unsigned short *x, unsigned short *y, Py_ssize_t n,
                                                  float scale, int bf16, long long *changed) {
    Py_ssize_t i = 0, end = n - n % H;
    VF sv;
    for (int k = 0; k < H; k++) sv[k] = scale;
    VI c = (VI){0};
    if (bf16) {
        for (; i < end; i += H) {
            VF a = BF16_VEC(x + i), p = a * sv;
            VU u;
            memcpy(&u, &p, sizeof u);
            VU rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
            VU nan = ((u >> 16) & 0x8000u) | 0x7fc0u;
            VU is_nan = (VU)((u & 0x7fffffffu) > 0x7f800000u);
            VU r = (nan & is_nan) | (rounded & ~is_nan);
            VH h = __builtin_convertvector(r, VH);
            memcpy(y + i, &h, sizeof h);
            VU rb = r << 16;
            VF b;
            memcpy(&b, &rb, sizeof b);
            c -= (b != a);
            c += (a != a);
        }
#ifdef F16_ROUND_STORE
    } else {
        for (; i < end; i += H) {
            VF a = F16_VEC(x + i), p = a * sv;
            VF b = F16_ROUND_STORE(y + i, p);
            c -= (b != a);
            c += (a != a);
        }
#else
    } else {
        return 0;
#endif
    }
    long long total = 0;
    for (int k = 0; k < H; k++) total += c[k];
    *changed += total;
    return end;
}

#undef F16_ROUND_STORE
#undef F16_VEC
#undef BF16_VEC
#undef VU
#undef VH
#undef SELECT
#undef VI
#undef VF
#undef P
#undef TARGET
#undef VARIANT
#undef H
