/* gradtool.core._kernels: the one-pass chunk kernel of gradtool/core/stats.py and norms.py.
 *
 * f32_summary(buffer) -> (min, max, sum, sumsq, zero_count) of a C-contiguous float32 buffer, in ONE pass
 * (the NumPy fallback takes five: min, max, x @ ones, row-blocked vecdot, count_nonzero(x == 0)):
 *   min, max   over the non-NaN elements (NaN is skipped; +-inf shows up here),
 *   sum        Σ x, and sumsq Σ x²: float32 partial sums of at most BLOCK/32 elements per SIMD lane, then
 *              added in float64 lanes (a buffer under SMALL_CHUNK = 4096 elements: in float64 outright);
 *              NaN whenever the buffer holds a NaN (or both infinities) and inf when it holds an infinity
 *              (or a float32 partial sum overflows, |x| > ~1e19 for sumsq), so finite sums prove a finite
 *              buffer,
 *   zero_count #{x == 0} (-0.0 included).
 * tests/core/test_kernels.py checks it against a float64 reference (math.fsum) and against the fallback.
 *
 * Written with GCC/Clang vector extensions, so it needs no intrinsics and builds on any architecture: the
 * loops (_kernels_loops.h) do the arithmetic of 16 logical float lanes with native vectors of the machine's
 * width, one build per width on x86-64 (AVX-512, AVX2, SSE2) chosen when the module is imported, 128-bit
 * vectors elsewhere; every width gives the same bits. The GIL is released during the loops, so two threads
 * run them on two cores. The extension is optional: if it does not build, gradtool uses the NumPy passes
 * (same statistics; norms differ in the last bits).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../_crc32.h" /* an npz member's CRC-32 taken in the pass that reads it (f32_summaries_fd's crc) */

#define BLOCK 1024

#define W 16 /* logical lanes: the arithmetic, and so the bits, of every build */

/* Half-precision values widened to float32, exactly (every float16 and bfloat16 value is a float32 value):
 * kind 0 is IEEE float16 (binary16), kind 1 bfloat16 (the top half of a float32). float16 by rebiasing the
 * exponent in the bits (F. Giesen's branch-free widening): subnormals through one exact float32
 * subtraction, inf and NaN kept (a NaN keeps its payload). Written as selects so that -O3 can vectorise
 * it for any target. */
#define HALF_F16 0
#define HALF_BF16 1

static inline uint32_t f16_bits_to_f32_bits(uint32_t h) {
    uint32_t o = (h & 0x7fffu) << 13; /* exponent and mantissa, in their float32 places */
    uint32_t e = o & (0x7c00u << 13);
    uint32_t normal = o + ((127u - 15u) << 23);  /* exponent rebiased */
    uint32_t special = normal + ((128u - 16u) << 23); /* inf and NaN: exponent all ones, payload kept */
    uint32_t sub_bits = normal + (1u << 23);
    float sub;
    memcpy(&sub, &sub_bits, 4);
    sub -= 6.103515625e-05f; /* (1 + m/1024)·2^-14 − 2^-14 = m·2^-24, exactly: zero and subnormals */
    memcpy(&sub_bits, &sub, 4);
    uint32_t r = e == (0x7c00u << 13) ? special : (e == 0 ? sub_bits : normal);
    return r | ((h & 0x8000u) << 16);
}

static inline float f16_to_f32(unsigned short h) {
    uint32_t bits = f16_bits_to_f32_bits(h);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float bf16_to_f32(unsigned short h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float32 rounded to float16 (to nearest, ties to even), as NumPy's astype(float16) rounds: overflow to
 * ±inf, gradual underflow, a NaN kept with its payload's top bits (0x7c01 where none survive). */
static inline uint16_t f32_bits_to_f16_bits(uint32_t f) {
    uint32_t sign = (f >> 16) & 0x8000u, a = f & 0x7fffffffu;
    if (a >= 0x7f800000u) { /* inf or NaN */
        uint32_t sig = a & 0x7fffffu;
        if (sig == 0) return (uint16_t)(sign | 0x7c00u);
        uint32_t h = 0x7c00u | (sig >> 13);
        return (uint16_t)(sign | (h == 0x7c00u ? 0x7c01u : h));
    }
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to 65520 or more: inf */
    if (a < 0x38800000u) { /* below float16's smallest normal, 2^-14: a subnormal or zero */
        if (a < 0x33000000u) return (uint16_t)sign;          /* below half the smallest subnormal, 2^-25 */
        float x, magic = 0.5f;                             /* 2^-1: its ulp is 2^-24, the subnormals' step */
        memcpy(&x, &a, 4);
        x += magic; /* rounded to nearest even by the FPU, at 2^-24 */
        uint32_t bits;
        memcpy(&bits, &x, 4);
        return (uint16_t)(sign | (bits - 0x3f000000u));
    }
    uint32_t odd = (a >> 13) & 1u;
    return (uint16_t)(sign | ((a - 0x38000000u + 0xfffu + odd) >> 13)); /* rebias, round, shift */
}

/* float32 rounded to bfloat16 (to nearest, ties to even), as ml_dtypes rounds: a NaN becomes ±0x7fc0. */
static inline uint16_t f32_bits_to_bf16_bits(uint32_t f) {
    if ((f & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((f >> 16) & 0x8000u) | 0x7fc0u);
    return (uint16_t)((f + 0x7fffu + ((f >> 16) & 1u)) >> 16);
}

/* The loops, once per native vector width (see _kernels_loops.h). On x86-64 with GCC or Clang: AVX-512,
 * AVX2 and SSE2 builds, the widest the CPU runs picked at import; elsewhere one portable 128-bit build. */
#if defined(__x86_64__) && defined(__GNUC__)
#define GT_X86_WIDTHS 1
#include <immintrin.h>
#define H 16
#define VARIANT(name) name##_w16
#define TARGET __attribute__((target("avx512f")))
#include "_kernels_loops.h"
#define H 8
#define VARIANT(name) name##_w8
#define TARGET __attribute__((target("avx2,f16c")))
#include "_kernels_loops.h"
#endif
#define H 4
#define VARIANT(name) name##_w4
#define TARGET
#include "_kernels_loops.h"

typedef void (*summary_loop_t)(const float *, Py_ssize_t, float *, float *, double *, double *, long long *);
typedef void (*scale_loop_t)(const float *, float *, Py_ssize_t, float, double *, long long *);
typedef Py_ssize_t (*half_loop_t)(const unsigned short *, float *, Py_ssize_t, int);
typedef Py_ssize_t (*narrow_loop_t)(const float *, unsigned short *, Py_ssize_t, int);
typedef void (*half_summary_loop_t)(const unsigned short *, Py_ssize_t, float *, float *, double *, double *,
                                   long long *);
typedef Py_ssize_t (*half_scale_loop_t)(const unsigned short *, unsigned short *, Py_ssize_t, float, int,
                                        long long *);
typedef struct {
    int lanes;
    const char *name;
    summary_loop_t summary;
    scale_loop_t scale;
    half_loop_t half;
    half_summary_loop_t f16_summary, bf16_summary;
    narrow_loop_t narrow;
    half_scale_loop_t half_scale;
} width_t;

/* Widest first; the portable build last (it runs everywhere). */
static const width_t widths[] = {
#ifdef GT_X86_WIDTHS
    {16, "avx512f", f32_summary_loop_w16, f32_scale_loop_w16, half_to_f32_loop_w16,
     f16_summary_loop_w16, bf16_summary_loop_w16, f32_to_half_loop_w16, half_scale_loop_w16},
    {8, "avx2", f32_summary_loop_w8, f32_scale_loop_w8, half_to_f32_loop_w8,
     f16_summary_loop_w8, bf16_summary_loop_w8, f32_to_half_loop_w8, half_scale_loop_w8},
#endif
    {4, "128-bit", f32_summary_loop_w4, f32_scale_loop_w4, half_to_f32_loop_w4,
     f16_summary_loop_w4, bf16_summary_loop_w4, f32_to_half_loop_w4, half_scale_loop_w4},
};
#define N_WIDTHS ((int)(sizeof widths / sizeof widths[0]))

static int runs_here(const width_t *w) {
#ifdef GT_X86_WIDTHS
    if (w->lanes == 16) return __builtin_cpu_supports("avx512f");
    if (w->lanes == 8) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#endif
    return 1;
}

static const width_t *chosen; /* set at import: the widest build this CPU runs */

/* Chunks shorter than SMALL_CHUNK elements (ROW in gradtool/core/norms.py) are summed exactly in float64,
 * as NumPy's passes sum them (a float32 product is exact in float64): small tensors get float64 sums, and
 * calling here costs 1-9 us (256-4095 elements) where NumPy's five passes cost ~30 us a chunk. DL
 * float64 lanes, element i in lane i % DL, the lanes added pairwise at the end: the same bits from any
 * compiler's vectorisation of them. min and max skip NaN; the sums are NaN or inf for a non-finite chunk. */
#define SMALL_CHUNK 4096
#define DL 8

static double lanes_total(const double *v) {
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

static void f32_summary_small(const float *x, Py_ssize_t n, float *lo_out, float *hi_out, double *sum_out,
                              double *sumsq_out, long long *zeros_out) {
    double s[DL] = {0}, q[DL] = {0};
    float lo[DL], hi[DL];
    long long z[DL] = {0};
    for (int k = 0; k < DL; k++) {
        lo[k] = INFINITY;
        hi[k] = -INFINITY;
    }
    Py_ssize_t i = 0, end = n - n % DL;
    for (; i < end; i += DL)
        for (int k = 0; k < DL; k++) {
            float v = x[i + k];
            double d = (double)v;
            lo[k] = v < lo[k] ? v : lo[k]; /* NaN compares false: skipped */
            hi[k] = v > hi[k] ? v : hi[k];
            z[k] += (v == 0.0f);
            s[k] += d;
            q[k] += d * d;
        }
    for (int k = 0; i < n; i++, k++) { /* the tail (< DL elements), one lane each */
        float v = x[i];
        double d = (double)v;
        lo[k] = v < lo[k] ? v : lo[k];
        hi[k] = v > hi[k] ? v : hi[k];
        z[k] += (v == 0.0f);
        s[k] += d;
        q[k] += d * d;
    }
    float slo = INFINITY, shi = -INFINITY;
    long long zeros = 0;
    for (int k = 0; k < DL; k++) {
        if (lo[k] < slo) slo = lo[k];
        if (hi[k] > shi) shi = hi[k];
        zeros += z[k];
    }
    *lo_out = slo;
    *hi_out = shi;
    *sum_out = lanes_total(s);
    *sumsq_out = lanes_total(q);
    *zeros_out = zeros;
}

/* y = x * scale and, in the same pass, the changed count and Σy² with f32_summary_small's arithmetic (so
 * f32_scale's sum of squares has the bits of f32_summary(y)'s at every length). */
static void f32_scale_small(const float *x, float *y, Py_ssize_t n, float scale, double *sumsq_out,
                            long long *changed_out) {
    double q[DL] = {0};
    long long changed = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        float v = x[i], o = v * scale;
        y[i] = o;
        changed += (o != v) && !(o != o && v != v);
        q[i % DL] += (double)o * (double)o;
    }
    *sumsq_out = lanes_total(q);
    *changed_out = changed;
}

/* One chunk's summary: exact for a short chunk, else the SIMD loop of `width`. */
static void summarize_chunk(const width_t *width, const float *x, Py_ssize_t n, float *lo, float *hi,
                            double *sum, double *sumsq, long long *zeros) {
    if (n < SMALL_CHUNK)
        f32_summary_small(x, n, lo, hi, sum, sumsq, zeros);
    else
        width->summary(x, n, lo, hi, sum, sumsq, zeros);
}

/* `code` ("f" or "d") as "f", "@f", "=f", or the explicit byte order of this machine ("<f" here; NumPy's
 * '<f4' views say so). */
static int native_float(const char *fmt, const char *code) {
    if (fmt == NULL) return 0;
#if PY_LITTLE_ENDIAN
    const char own = '<';
#else
    const char own = '>';
#endif
    if (fmt[0] == '@' || fmt[0] == '=' || fmt[0] == own || (fmt[0] == '!' && own == '>')) fmt++;
    return strcmp(fmt, code) == 0;
}

static int native_float32(const char *fmt) { return native_float(fmt, "f"); }

/* Take `obj`'s buffer into `view` if it is C-contiguous native float32 (code "f", 4 bytes) or float64 ("d",
 * 8 bytes), as asked; else set TypeError and return -1. */
static int take_float(PyObject *obj, Py_buffer *view, const char *who, const char *code) {
    Py_ssize_t itemsize = code[0] == 'd' ? 8 : 4;
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (view->itemsize != itemsize || !native_float(view->format, code)) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s needs C-contiguous %s buffers", who, itemsize == 8 ? "float64" : "float32");
        return -1;
    }
    return 0;
}

static int take_f32(PyObject *obj, Py_buffer *view, const char *who) { return take_float(obj, view, who, "f"); }
static int take_f64(PyObject *obj, Py_buffer *view, const char *who) { return take_float(obj, view, who, "d"); }

static PyObject *summary_with(PyObject *arg, const width_t *width) {
    Py_buffer view;
    if (take_f32(arg, &view, "f32_summary") < 0) return NULL;
    Py_ssize_t n = view.len / 4;
    float lo = INFINITY, hi = -INFINITY;
    double total = 0.0, total_sq = 0.0;
    long long zeros = 0;
    Py_BEGIN_ALLOW_THREADS
    summarize_chunk(width, (const float *)view.buf, n, &lo, &hi, &total, &total_sq, &zeros);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("(ddddL)", (double)lo, (double)hi, total, total_sq, zeros);
}

static PyObject *f32_summary(PyObject *self, PyObject *arg) { return summary_with(arg, chosen); }

/* f32_summaries(buffer, chunk_elements) -> list of f32_summary tuples, one per chunk of chunk_elements
 * (the last may be shorter), all computed in one call without the GIL: a 16 MiB window costs one GIL
 * round trip instead of sixteen, which is what lets two threads share two cores. */
typedef struct {
    float lo, hi;
    double sum, sumsq;
    long long zeros;
} summary_t;

/* A list of (min, max, sum, sumsq, zero_count) tuples from `count` summaries; frees `out`. */
static PyObject *summaries_to_list(summary_t *out, Py_ssize_t count) {
    PyObject *list = PyList_New(count);
    for (Py_ssize_t c = 0; list != NULL && c < count; c++) {
        PyObject *t = Py_BuildValue("(ddddL)", (double)out[c].lo, (double)out[c].hi, out[c].sum, out[c].sumsq,
                                    out[c].zeros);
        if (t == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, c, t);
    }
    PyMem_RawFree(out);
    return list;
}

static PyObject *summaries_with(PyObject *obj, Py_ssize_t chunk, int kind, const width_t *width);

static PyObject *f32_summaries(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t chunk;
    if (!PyArg_ParseTuple(args, "On", &obj, &chunk)) return NULL;
    return summaries_with(obj, chunk, -1, chosen);
}

static void half_to_f32_with(const width_t *width, const uint16_t *src, float *dst, Py_ssize_t n, int kind) {
    uint32_t *out = (uint32_t *)dst;
    Py_ssize_t i = width->half(src, dst, n, kind == HALF_BF16); /* the vector loop, then the rest */
    for (; i < n; i++) out[i] = kind == HALF_BF16 ? (uint32_t)src[i] << 16 : f16_bits_to_f32_bits(src[i]);
}

static void half_to_f32(const uint16_t *src, float *dst, Py_ssize_t n, int kind) {
    half_to_f32_with(chosen, src, dst, n, kind);
}

/* One chunk of float16 (kind 0) or bfloat16 (kind 1) values summarised as their float32 values: a short chunk
 * widened into a stack buffer for f32_summary_small, else the width's loop, which widens as it loads. */
static void summarize_half_chunk(const width_t *width, const uint16_t *x, Py_ssize_t n, int kind, float *lo,
                                 float *hi, double *sum, double *sumsq, long long *zeros) {
    if (n < SMALL_CHUNK) {
        float wide[SMALL_CHUNK];
        half_to_f32_with(width, x, wide, n, kind);
        f32_summary_small(wide, n, lo, hi, sum, sumsq, zeros);
    } else {
        (kind == HALF_BF16 ? width->bf16_summary : width->f16_summary)(x, n, lo, hi, sum, sumsq, zeros);
    }
}

/* Take `obj`'s buffer into `view` if it is C-contiguous with 2-byte items; else TypeError and -1. */
static int take_u16(PyObject *obj, Py_buffer *view, const char *who) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (view->itemsize != 2) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s needs C-contiguous 2-byte (uint16 view) buffers", who);
        return -1;
    }
    return 0;
}

static int half_kind(int kind) {
    if (kind != HALF_F16 && kind != HALF_BF16) {
        PyErr_SetString(PyExc_ValueError, "kind must be 0 (float16) or 1 (bfloat16)");
        return -1;
    }
    return 0;
}

/* half_to_f32_width(src, out, kind, lanes): out[:] = src widened to float32 by that width's build (src: a
 * uint16 view of float16 or bfloat16 values; out: as many float32), for the tests. */
static PyObject *half_widen_with(PyObject *src_obj, PyObject *out_obj, int kind, const width_t *width) {
    if (half_kind(kind) < 0) return NULL;
    Py_buffer src, out;
    if (take_u16(src_obj, &src, "half_to_f32") < 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (out.itemsize != 4 || !native_float32(out.format) || out.len / 4 != src.len / 2) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_TypeError, "half_to_f32 needs a float32 output of the input's length");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    half_to_f32_with(width, (const uint16_t *)src.buf, (float *)out.buf, src.len / 2, kind);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* One chunk of float32 (kind -1), float16 (0) or bfloat16 (1) values summarised into `o`. */
static void summarize_kind(const width_t *width, const void *x, Py_ssize_t n, int kind, summary_t *o) {
    if (kind == -1)
        summarize_chunk(width, (const float *)x, n, &o->lo, &o->hi, &o->sum, &o->sumsq, &o->zeros);
    else
        summarize_half_chunk(width, (const uint16_t *)x, n, kind, &o->lo, &o->hi, &o->sum, &o->sumsq,
                             &o->zeros);
}

/* The summaries of each chunk of a buffer of float32 (kind -1: f32_summaries) or of float16 (kind 0) or
 * bfloat16 (kind 1) values as float32 (widened as they are loaded: half_summaries, whose results are
 * f32_summaries(chunk.astype(float32)) bit for bit; NumPy's float16 cast alone ran at ~1 GB/s), in one call
 * without the GIL. */
static PyObject *summaries_with(PyObject *obj, Py_ssize_t chunk, int kind, const width_t *width) {
    if (kind != -1 && half_kind(kind) < 0) return NULL;
    if (chunk <= 0) {
        PyErr_SetString(PyExc_ValueError, "chunk_elements must be positive");
        return NULL;
    }
    Py_buffer view;
    if ((kind == -1 ? take_f32(obj, &view, "f32_summaries") : take_u16(obj, &view, "half_summaries")) < 0)
        return NULL;
    Py_ssize_t item = kind == -1 ? 4 : 2, n = view.len / item, count = (n + chunk - 1) / chunk;
    summary_t *out = PyMem_RawMalloc((size_t)(count > 0 ? count : 1) * sizeof(summary_t));
    if (out == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    const char *x = (const char *)view.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t c = 0; c < count; c++) {
        Py_ssize_t start = c * chunk, len = n - start < chunk ? n - start : chunk;
        summarize_kind(width, x + start * item, len, kind, &out[c]);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return summaries_to_list(out, count);
}

static PyObject *half_summaries(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t chunk;
    int kind;
    if (!PyArg_ParseTuple(args, "Oni", &obj, &chunk, &kind) || half_kind(kind) < 0) return NULL;
    return summaries_with(obj, chunk, kind, chosen);
}

/* float32 values rounded to float16 (kind 0) or bfloat16 (kind 1): the width's vector loop, then the rest. */
static void f32_to_half_with(const width_t *width, const float *src, uint16_t *dst, Py_ssize_t n, int kind) {
    Py_ssize_t i = width->narrow(src, dst, n, kind == HALF_BF16);
    const uint32_t *bits = (const uint32_t *)src;
    for (; i < n; i++)
        dst[i] = kind == HALF_BF16 ? f32_bits_to_bf16_bits(bits[i]) : f32_bits_to_f16_bits(bits[i]);
}

/* The writable C-contiguous output `out` of a kernel, as many bytes as its input `src`; 0, or -1 with an
 * error set and both buffers released. */
static int take_out(PyObject *obj, Py_buffer *out, Py_buffer *src, const char *who) {
    if (PyObject_GetBuffer(obj, out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(src);
        return -1;
    }
    if (out->len != src->len) {
        PyBuffer_Release(src);
        PyBuffer_Release(out);
        PyErr_Format(PyExc_ValueError, "%s needs an output of the input's size", who);
        return -1;
    }
    return 0;
}

/* half_scale(src, scale, out, kind) -> (sumsq of out, changed count):
 * out = round(widen(src) · float32(scale)) for float16 (kind 0) or bfloat16 (kind 1) values (uint16 views;
 * out may be src), as gradtool's scale_tensor computes it with NumPy (multiply in float32, round once), in
 * blocks that stay in L1; the changed count is #(out != src) less both NaN, as clip counts; the sum of
 * squares is that of out's float32 values summarised as ONE chunk (half_summaries' bits), for the norm
 * after. GIL released. NumPy's float16 casts ran at ~0.5 GB/s here (and far slower where the results are
 * subnormal: clip of a 250 MB float16 dump took 10.7 s). */
#define SCALE_BLOCK 2048
/* How many of n float16 (kind 0) or bfloat16 (kind 1) values changed from a to b as floats compare them, NaN
 * to NaN not counted (clip's count): the bits differ, and not both NaN (magnitude above inf's), and not both
 * zeros (+0 == -0). On 16-bit lanes; widening b again to compare floats took half of half_scale's time. */
static long long half_changes(const uint16_t *a, const uint16_t *b, Py_ssize_t n, int kind) {
    uint16_t inf = kind == HALF_BF16 ? 0x7f80 : 0x7c00;
    long long changed = 0;
    for (Py_ssize_t i = 0; i < n; i += SCALE_BLOCK) { /* int counters a block: vectorised */
        Py_ssize_t len = n - i < SCALE_BLOCK ? n - i : SCALE_BLOCK;
        int differ = 0;
        for (Py_ssize_t j = 0; j < len; j++) {
            uint16_t x = a[i + j], y = b[i + j], mx = x & 0x7fff, my = y & 0x7fff;
            differ += (x != y) & !((mx > inf) & (my > inf)) & ((mx | my) != 0);
        }
        changed += differ;
    }
    return changed;
}

/* half_scale's work with a width's loops: y = round(widen(x) · s), the changed count, the sum of squares of
 * y as one chunk. GIL released by the caller. */
static void half_scale_with(const width_t *width, const uint16_t *x, uint16_t *y, Py_ssize_t n, float s,
                            int kind, double *sumsq, long long *changed_out) {
    float lo, hi;
    double sum;
    long long zeros, changed = 0;
    float wide[SCALE_BLOCK];
    uint16_t kept[SCALE_BLOCK]; /* the block's input bits, when out is src */
    for (Py_ssize_t i = 0; i < n; i += SCALE_BLOCK) {
        Py_ssize_t len = n - i < SCALE_BLOCK ? n - i : SCALE_BLOCK;
        /* the width's loop, in registers (bfloat16 1.56 -> 2.25, float16 1.88 -> 3.76 Gelem/s here, with
         * the summary pass), then the rest (the tail, float16 in the portable build) a step a pass */
        Py_ssize_t done = width->half_scale(x + i, y + i, len, s, kind == HALF_BF16, &changed);
        if (done == len) continue;
        const uint16_t *was = x + i + done;
        len -= done;
        if (x == y) {
            memcpy(kept, was, (size_t)len * 2);
            was = kept;
        }
        half_to_f32_with(width, was, wide, len, kind);
        for (Py_ssize_t j = 0; j < len; j++) wide[j] *= s;
        f32_to_half_with(width, wide, y + i + done, len, kind);
        changed += half_changes(was, y + i + done, len, kind);
    }
    summarize_half_chunk(width, y, n, kind, &lo, &hi, &sum, sumsq, &zeros);
    *changed_out = changed;
}

static PyObject *half_scale_py(PyObject *args, const width_t *width) {
    PyObject *src_obj, *out_obj;
    double scale;
    int kind;
    if (!PyArg_ParseTuple(args, "OdOi", &src_obj, &scale, &out_obj, &kind) || half_kind(kind) < 0)
        return NULL;
    Py_buffer src, out;
    if (take_u16(src_obj, &src, "half_scale") < 0 || take_out(out_obj, &out, &src, "half_scale") < 0)
        return NULL;
    double sumsq;
    long long changed;
    Py_BEGIN_ALLOW_THREADS
    half_scale_with(width, (const uint16_t *)src.buf, (uint16_t *)out.buf, src.len / 2, (float)scale, kind,
                    &sumsq, &changed);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    return Py_BuildValue("(dL)", sumsq, changed);
}

static PyObject *half_scale(PyObject *self, PyObject *args) {
    return half_scale_py(args, chosen);
}

/* The buffers of a *_scale_slices call: src (uint16, itemsize 2, or float32, 4), its float32 scales, one
 * per slice, and a separate output of src's size holding whole slices; 0, or -1 with an error set and all
 * three released. */
static int take_slices(PyObject *src_obj, PyObject *scales_obj, PyObject *out_obj, Py_buffer *src,
                       Py_buffer *scales, Py_buffer *out, Py_ssize_t itemsize, const char *who) {
    if ((itemsize == 2 ? take_u16(src_obj, src, who) : take_f32(src_obj, src, who)) < 0) return -1;
    if (take_f32(scales_obj, scales, who) < 0) {
        PyBuffer_Release(src);
        return -1;
    }
    if (take_out(out_obj, out, src, who) < 0) {
        PyBuffer_Release(scales);
        return -1;
    }
    Py_ssize_t n = src->len / itemsize, k = scales->len / 4;
    if (k == 0 || n % k != 0 || out->buf == src->buf) {
        PyBuffer_Release(src);
        PyBuffer_Release(scales);
        PyBuffer_Release(out);
        PyErr_Format(PyExc_ValueError, "%s needs whole slices, one a scale, and a separate output of the "
                                       "input's size", who);
        return -1;
    }
    return 0;
}

/* half_scale_slices(src, scales, out, kind, by_row) -> changed count: half_scale with a scale per slice of
 * src (a uint16 view of float16, kind 0, or bfloat16, kind 1, values; out may not be src): by_row 0, a
 * scale per column of rows of len(scales) elements, out[r, j] = round(widen(src[r, j]) · scales[j]); by_row
 * 1, a scale per row of len(src) / len(scales) elements, out[r, j] = round(widen(src[r, j]) · scales[r])
 * (float32 scales); src's element as it is, bits and all, where its scale is negative (a slice not clipped:
 * a clipping scale c / ||slice|| is never negative; NaN, for a NaN norm, is a scale, as TF's formula has it);
 * the changed count as half_scale counts it. GIL released. Per-slice clipping (clip --mode norm --axes) of
 * float16 went through NumPy's casts: the float16 GPT-2 set by columns 9.1 s, float32 0.8 s. */
static PyObject *half_scale_slices(PyObject *self, PyObject *args) {
    PyObject *src_obj, *scales_obj, *out_obj;
    int kind, by_row;
    if (!PyArg_ParseTuple(args, "OOOip", &src_obj, &scales_obj, &out_obj, &kind, &by_row)
        || half_kind(kind) < 0)
        return NULL;
    Py_buffer src, scales, out;
    if (take_slices(src_obj, scales_obj, out_obj, &src, &scales, &out, 2, "half_scale_slices") < 0) return NULL;
    Py_ssize_t n = src.len / 2, k = scales.len / 4;
    Py_ssize_t w = by_row ? n / k : k; /* the row length */
    const uint16_t *x = (const uint16_t *)src.buf;
    const float *s = (const float *)scales.buf;
    uint16_t *y = (uint16_t *)out.buf;
    long long changed = 0;
    Py_BEGIN_ALLOW_THREADS
    float before[SCALE_BLOCK], after[SCALE_BLOCK];
    /* by columns: keep[j] all ones where column j is kept (its scale negative), to blend the input's bits
     * back on 16-bit lanes; NULL where none is (or, out of memory, a select per element). A compare and
     * branch per element made clipping by columns 2.7x slower than by rows. */
    int any_kept = 0;
    uint16_t *keep = NULL;
    if (!by_row) {
        for (Py_ssize_t j = 0; j < k; j++) any_kept |= s[j] < 0;
        if (any_kept && (keep = (uint16_t *)PyMem_RawMalloc((size_t)k * 2)) != NULL)
            for (Py_ssize_t j = 0; j < k; j++) keep[j] = s[j] < 0 ? 0xffff : 0;
    }
    for (Py_ssize_t r = 0; r < n; r += w) {
        if (by_row && s[r / w] < 0) { /* a row kept */
            memcpy(y + r, x + r, (size_t)w * 2);
            continue;
        }
        for (Py_ssize_t c = 0; c < w; c += SCALE_BLOCK) {
            Py_ssize_t len = w - c < SCALE_BLOCK ? w - c : SCALE_BLOCK;
            const uint16_t *xs = x + r + c;
            uint16_t *ys = y + r + c;
            if (by_row) { /* one scale for the block: half_scale's loop in registers, then the rest */
                Py_ssize_t done = chosen->half_scale(xs, ys, len, s[r / w], kind == HALF_BF16, &changed);
                xs += done;
                ys += done;
                len -= done;
                if (len == 0) continue;
            }
            half_to_f32(xs, before, len, kind);
            if (by_row) {
                float sr = s[r / w];
                for (Py_ssize_t j = 0; j < len; j++) after[j] = before[j] * sr;
            } else {
                for (Py_ssize_t j = 0; j < len; j++) after[j] = before[j] * s[c + j];
            }
            f32_to_half_with(chosen, after, ys, len, kind);
            if (keep != NULL) {
                const uint16_t *m = keep + c;
                for (Py_ssize_t j = 0; j < len; j++) ys[j] = (uint16_t)((xs[j] & m[j]) | (ys[j] & ~m[j]));
            } else if (any_kept) {
                for (Py_ssize_t j = 0; j < len; j++)
                    if (s[c + j] < 0) ys[j] = xs[j];
            }
            changed += half_changes(xs, ys, len, kind);
        }
    }
    PyMem_RawFree(keep);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&scales);
    PyBuffer_Release(&out);
    return PyLong_FromLongLong(changed);
}

/* f32_scale_slices(src, scales, out, by_row) -> changed count: half_scale_slices for float32 values: by_row
 * 0, out[r, j] = src[r, j] · scales[j] (float32 product) for rows of len(scales) elements; by_row 1,
 * out[r, j] = src[r, j] · scales[r] for len(scales) rows; src's element as it is, bits and all, where its
 * scale is negative (a slice not clipped); the changed count that of clip's _changed (out != src, NaN to
 * NaN not counted). The arithmetic of clipping.scale_tensor with float32 scales (the caller leaves scales
 * below float32's normal range to it), NaN payloads aside: where both the element and its scale (a NaN
 * norm's) are NaN, which of the two the product keeps is the compiler's choice (and NumPy's differs
 * between its loops). GIL released. Per-column clipping of float32 went through NumPy's
 * product, a where() and a comparison pass. */
static PyObject *f32_scale_slices(PyObject *self, PyObject *args) {
    PyObject *src_obj, *scales_obj, *out_obj;
    int by_row;
    if (!PyArg_ParseTuple(args, "OOOp", &src_obj, &scales_obj, &out_obj, &by_row)) return NULL;
    Py_buffer src, scales, out;
    if (take_slices(src_obj, scales_obj, out_obj, &src, &scales, &out, 4, "f32_scale_slices") < 0) return NULL;
    Py_ssize_t n = src.len / 4, k = scales.len / 4;
    Py_ssize_t w = by_row ? n / k : k; /* the row length */
    const float *x = (const float *)src.buf;
    const float *s = (const float *)scales.buf;
    float *y = (float *)out.buf;
    long long changed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < n; r += w) {
        float sr = by_row ? s[r / w] : 0.0f;
        if (by_row && sr < 0) { /* a row kept */
            memcpy(y + r, x + r, (size_t)w * 4);
            continue;
        }
        for (Py_ssize_t c = 0; c < w; c += SCALE_BLOCK) {
            Py_ssize_t len = w - c < SCALE_BLOCK ? w - c : SCALE_BLOCK;
            const float *restrict xs = x + r + c, *restrict sc = s + c;
            float *restrict ys = y + r + c;
            /* simple loops the compiler vectorises: a kept column's element by a select (it moves the bits,
             * NaN payloads too), never a branch or a conditional store */
            if (by_row)
                for (Py_ssize_t j = 0; j < len; j++) ys[j] = xs[j] * sr;
            else
                for (Py_ssize_t j = 0; j < len; j++) {
                    float p = xs[j] * sc[j];
                    ys[j] = sc[j] < 0 ? xs[j] : p;
                }
            int differ = 0; /* int counters a block: vectorised */
            for (Py_ssize_t j = 0; j < len; j++) {
                float a = xs[j], b = ys[j];
                differ += (a != b) & !((a != a) & (b != b));
            }
            changed += differ;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&scales);
    PyBuffer_Release(&out);
    return PyLong_FromLongLong(changed);
}

/* column_sumsq(src, acc, kind) -> None: acc[j] += x[r, j]² for each row r of src in order, x the rows of
 * len(acc) elements of src (float32, kind -1; or a uint16 view of float16, kind 0, or bfloat16, kind 1,
 * values), each widened exactly to float64 and squared there, acc a float64 buffer: the products and the
 * additions, in the same order, of NumPy's sum over the leading axis of the squares (a reduction over a
 * leading axis adds row after row into one accumulator), so the same bits (NaN payloads aside, where a
 * column holds two different NaNs). GIL released. clip --mode norm --axes 0 took the squares through
 * NumPy's float64 copies: ~1 ns an element, the largest part of clipping the float16 GPT-2 set by columns. */
static PyObject *column_sumsq(PyObject *self, PyObject *args) {
    PyObject *src_obj, *acc_obj;
    int kind;
    if (!PyArg_ParseTuple(args, "OOi", &src_obj, &acc_obj, &kind) || (kind != -1 && half_kind(kind) < 0))
        return NULL;
    Py_buffer src, acc;
    if ((kind == -1 ? take_f32(src_obj, &src, "column_sumsq") : take_u16(src_obj, &src, "column_sumsq")) < 0)
        return NULL;
    if (PyObject_GetBuffer(acc_obj, &acc, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    Py_ssize_t w = acc.len / 8, n = src.len / (kind == -1 ? 4 : 2);
    if (acc.itemsize != 8 || !native_float(acc.format, "d") || w == 0 || n % w != 0) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&acc);
        PyErr_SetString(PyExc_ValueError, "column_sumsq needs a float64 accumulator of one row's length and "
                                          "whole rows");
        return NULL;
    }
    double *a = (double *)acc.buf;
    Py_BEGIN_ALLOW_THREADS
    float wide[SCALE_BLOCK];
    for (Py_ssize_t r = 0; r < n; r += w) {
        for (Py_ssize_t c = 0; c < w; c += SCALE_BLOCK) {
            Py_ssize_t len = w - c < SCALE_BLOCK ? w - c : SCALE_BLOCK;
            const float *f = wide;
            if (kind == -1)
                f = (const float *)src.buf + r + c;
            else
                half_to_f32((const uint16_t *)src.buf + r + c, wide, len, kind);
            double *ac = a + c;
            for (Py_ssize_t j = 0; j < len; j++) {
                double d = (double)f[j];
                ac[j] += d * d;
            }
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&acc);
    Py_RETURN_NONE;
}

/* A float16 or bfloat16 value's bits as a key that orders values as their floats do (but NaN): the
 * magnitude for a positive value, its bits with the magnitude's bits flipped (a negative int16 that falls
 * as the magnitude grows) for a negative one; -0 is -1, just under +0. */
static inline int16_t half_order(uint16_t b) {
    return (int16_t)(b ^ (uint16_t)(-(int16_t)(b >> 15) & 0x7fff));
}

/* Vectors of two doubles and their masks (SSE2's on every x86-64; another target lowers them): GCC
 * vectorises no scalar form of the float64 loops below. */
typedef double f64x2 __attribute__((vector_size(16)));
typedef long long i64x2 __attribute__((vector_size(16)));
/* a where a > b, else b (b where a is NaN), lane by lane: SSE2's maxpd, else a mask */
#ifdef __SSE2__
#include <emmintrin.h>
#define F64X2_MAX(a, b) ((f64x2)_mm_max_pd((__m128d)(a), (__m128d)(b)))
#else
static inline f64x2 f64x2_max(f64x2 a, f64x2 b) {
    i64x2 more = a > b;
    return (f64x2)(((i64x2)a & more) | ((i64x2)b & ~more));
}
#define F64X2_MAX(a, b) f64x2_max((a), (b))
#endif
/* clip_values' float64 loop: out = hi where x > hi, lo where x < lo, else x (NaN kept, payload and all);
 * *changed and *odd (NaN or ±inf) counted. Written with f64x2 vectors: its scalar form (a comparison's
 * 32-bit int against 64-bit lanes) ran branch by branch, 3.3 ns an element. Loads and stores by memcpy:
 * well defined at any alignment (a NumPy view need not be aligned), an ordinary load or store where it
 * is. */
static void clip_f64(const char *x, char *y, Py_ssize_t n, double lo, double hi, long long *changed,
                     long long *odd) {
    const f64x2 vlo = {lo, lo}, vhi = {hi, hi}, top = {DBL_MAX, DBL_MAX};
    const i64x2 magnitude = {0x7fffffffffffffffLL, 0x7fffffffffffffffLL};
    i64x2 clipped = {0, 0}, bad = {0, 0};
    Py_ssize_t i = 0;
    for (; i + 2 <= n; i += 2) {
        f64x2 v, r;
        memcpy(&v, x + 8 * i, 16);
        i64x2 high = v > vhi, low = v < vlo; /* -1 where true */
        r = (f64x2)(((i64x2)vlo & low) | ((i64x2)v & ~low));
        r = (f64x2)(((i64x2)vhi & high) | ((i64x2)r & ~high));
        memcpy(y + 8 * i, &r, 16);
        clipped -= high + low;
        bad -= ~((f64x2)((i64x2)v & magnitude) <= top); /* NaN or ±inf: |v| <= DBL_MAX false */
    }
    long long c = clipped[0] + clipped[1], b = bad[0] + bad[1];
    for (; i < n; i++) {
        double v, r;
        memcpy(&v, x + 8 * i, 8);
        r = v < lo ? lo : v;
        r = v > hi ? hi : r;
        memcpy(y + 8 * i, &r, 8);
        c += (v > hi) + (v < lo);
        b += !(fabs(v) <= DBL_MAX);
    }
    *changed = c;
    *odd = b;
}

/* clip_values(src, lo, hi, out, kind) -> (changed count, non-finite count): TF's clip_by_value as
 * gradtool's NumPy path computes it, in one pass without the GIL: out = hi where src > hi, lo where src < lo,
 * else src, bits and all (NaN stays NaN, its payload too; ±inf are clipped); the changed count is the
 * elements clipped (src > hi or src < lo: never equal to the bound), the non-finite count the NaN and ±inf
 * in src (the "error" policy refuses those). kind -1: float32 src and out, lo and hi rounded to float32 as
 * NumPy's astype rounds a double; kind -2: float64 src and out, lo and hi as they are (clip_f64); kind 0
 * or 1: float16 or bfloat16 (uint16 views), compared as their values are (by the order of their bits),
 * with lo and hi given as the bits of the bounds in that type (rounded by the caller, as NumPy rounds a
 * double to it) and hi <= lo never (the caller checks). NumPy's passes (the comparisons, two where, the
 * checks) took clip --mode value of the GPT-2 set 1.8 s, 2.9 s in float16, where a scale takes 0.4 s. */
static PyObject *clip_values(PyObject *self, PyObject *args) {
    PyObject *src_obj, *lo_obj, *hi_obj, *out_obj;
    int kind;
    if (!PyArg_ParseTuple(args, "OOOOi", &src_obj, &lo_obj, &hi_obj, &out_obj, &kind)) return NULL;
    if (kind < -2 || kind > HALF_BF16) {
        PyErr_SetString(PyExc_ValueError, "clip_values' kind must be -1 (float32), -2 (float64), 0 (float16) or "
                                          "1 (bfloat16)");
        return NULL;
    }
    double lo_d = 0, hi_d = 0;
    unsigned long lo_bits = 0, hi_bits = 0;
    if (kind < 0) {
        lo_d = PyFloat_AsDouble(lo_obj);
        hi_d = PyFloat_AsDouble(hi_obj);
    } else {
        lo_bits = PyLong_AsUnsignedLong(lo_obj);
        hi_bits = PyLong_AsUnsignedLong(hi_obj);
        if (!PyErr_Occurred() && (lo_bits > 0xffff || hi_bits > 0xffff))
            PyErr_SetString(PyExc_ValueError, "clip_values needs the bounds' 16 bits for a half kind");
    }
    if (PyErr_Occurred()) return NULL;
    Py_buffer src, out;
    if ((kind == -1 ? take_f32(src_obj, &src, "clip_values") : kind == -2 ? take_f64(src_obj, &src, "clip_values")
         : take_u16(src_obj, &src, "clip_values")) < 0
        || take_out(out_obj, &out, &src, "clip_values") < 0)
        return NULL;
    long long changed = 0, nonfinite = 0;
    Py_BEGIN_ALLOW_THREADS
    if (kind == -1) {
        Py_ssize_t n = src.len / 4;
        const float *x = (const float *)src.buf;
        float *y = (float *)out.buf, lo = (float)lo_d, hi = (float)hi_d;
        for (Py_ssize_t i = 0; i < n; i += SCALE_BLOCK) { /* int counters a block: vectorised */
            Py_ssize_t len = n - i < SCALE_BLOCK ? n - i : SCALE_BLOCK;
            int clipped = 0, odd = 0;
            for (Py_ssize_t j = 0; j < len; j++) {
                float v = x[i + j];
                int high = v > hi, low = v < lo;
                float r = low ? lo : v;
                y[i + j] = high ? hi : r;
                clipped += high + low;
                odd += !(fabsf(v) <= FLT_MAX); /* NaN or ±inf */
            }
            changed += clipped;
            nonfinite += odd;
        }
    } else if (kind == -2)
        clip_f64((const char *)src.buf, (char *)out.buf, src.len / 8, lo_d, hi_d, &changed, &nonfinite);
    else {
        Py_ssize_t n = src.len / 2;
        const uint16_t *x = (const uint16_t *)src.buf;
        uint16_t *y = (uint16_t *)out.buf, lo_h = (uint16_t)lo_bits, hi_h = (uint16_t)hi_bits;
        /* compared by their bits: both types are sign and magnitude, so half_order's keys rank every value
         * but NaN as its float does (-inf lowest, -0 just under +0); NaN (magnitude above inf's) takes no
         * part. A zero bound stands for both zeros: v > hi compares with +0's key, v < lo with -0's. Every
         * operation is on 16-bit lanes (the float32 comparisons of widened values ran at 0.35 GB/s). */
        uint16_t inf = kind == HALF_BF16 ? 0x7f80 : 0x7c00;
        int16_t hi_k = (hi_h & 0x7fff) == 0 ? 0 : half_order(hi_h);
        int16_t lo_k = (lo_h & 0x7fff) == 0 ? -1 : half_order(lo_h);
        for (Py_ssize_t i = 0; i < n; i += SCALE_BLOCK) {
            Py_ssize_t len = n - i < SCALE_BLOCK ? n - i : SCALE_BLOCK;
            int clipped = 0, odd = 0;
            for (Py_ssize_t j = 0; j < len; j++) {
                uint16_t b = x[i + j], m = b & 0x7fff;
                int16_t k = half_order(b);
                int number = m <= inf; /* not NaN */
                int high = (k > hi_k) & number, low = (k < lo_k) & number;
                uint16_t r = low ? lo_h : b;
                y[i + j] = high ? hi_h : r;
                clipped += high + low;
                odd += m >= inf; /* NaN or ±inf */
            }
            changed += clipped;
            nonfinite += odd;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    return Py_BuildValue("(LL)", changed, nonfinite);
}

/* The float64 L2 pass over r = x[i] (y NULL) or r = fl(x[i] · s) written to y[i] (scaled; y may be x):
 * max |r| (NaN when any r is NaN), Σr² in a fixed order (element i into running sum i mod 8, the eight
 * combined ((q0+q1)+(q2+q3))+((q4+q5)+(q6+q7)) at the end: the same bits from every build,
 * -ffp-contract=off; error ~n/8 ulp of the sum), and, scaled, how many r differ from x[i] (NaN to NaN not).
 * Σout² of a scaling is therefore f64_summary(out)'s, bit for bit. The eight sums are four vectors of two
 * (clip_f64's types: GCC vectorises no scalar form of this loop); loads and stores by memcpy (any
 * alignment). */
static void f64_pass(const char *x, char *y, Py_ssize_t n, double s, double *amax, double *sumsq,
                     long long *changed) {
    const f64x2 vs = {s, s};
    const i64x2 magnitude = {0x7fffffffffffffffLL, 0x7fffffffffffffffLL};
    f64x2 q[4] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}}, m[4] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
    i64x2 c[4] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}}, bad[4] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
    Py_ssize_t full = n - n % 8;
#define F64_MEASURE(r, k)                                                                                    \
    do {                                                                                                     \
        m[k] = F64X2_MAX((f64x2)((i64x2)(r) & magnitude), m[k]);                                             \
        q[k] += (r) * (r);                                                                                   \
        bad[k] |= (r) != (r);                                                                                \
    } while (0)
    if (y != NULL) {
        for (Py_ssize_t i = 0; i < full; i += 8) {
            f64x2 v[4], r[4];
            memcpy(v, x + 8 * i, 64); /* (all loaded before any store: y may be x) */
            for (int k = 0; k < 4; k++) {
                r[k] = v[k] * vs;
                c[k] -= (r[k] != v[k]) & ~((r[k] != r[k]) & (v[k] != v[k]));
                F64_MEASURE(r[k], k);
            }
            memcpy(y + 8 * i, r, 64);
        }
    } else {
        for (Py_ssize_t i = 0; i < full; i += 8) {
            f64x2 v[4];
            memcpy(v, x + 8 * i, 64);
            for (int k = 0; k < 4; k++) F64_MEASURE(v[k], k);
        }
    }
#undef F64_MEASURE
    double mm = 0;
    long long cc = 0, bb = 0;
    for (Py_ssize_t i = full; i < n; i++) { /* the rest, element i into running sum i mod 8 */
        double v, r;
        memcpy(&v, x + 8 * i, 8);
        r = y != NULL ? v * s : v;
        if (y != NULL) {
            memcpy(y + 8 * i, &r, 8);
            cc += (r != v) & !((r != r) & (v != v));
        }
        int j = (int)(i - full);
        q[j / 2][j % 2] += r * r;
        mm = fabs(r) > mm ? fabs(r) : mm;
        bb |= r != r;
    }
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < 2; l++) {
            mm = m[k][l] > mm ? m[k][l] : mm;
            bb |= bad[k][l];
            cc += c[k][l];
        }
    *amax = bb ? NAN : mm;
    *sumsq = ((q[0][0] + q[0][1]) + (q[1][0] + q[1][1])) + ((q[2][0] + q[2][1]) + (q[3][0] + q[3][1]));
    *changed = cc;
}

/* f64_summary(src) -> (max |x|, Σx²) of C-contiguous float64 values (f64_pass), GIL released. */
static PyObject *f64_summary(PyObject *self, PyObject *arg) {
    Py_buffer src;
    if (take_f64(arg, &src, "f64_summary") < 0) return NULL;
    double amax, sumsq;
    long long unused;
    Py_BEGIN_ALLOW_THREADS
    f64_pass((const char *)src.buf, NULL, src.len / 8, 1.0, &amax, &sumsq, &unused);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    return Py_BuildValue("(dd)", amax, sumsq);
}

/* f64_scale(src, scale, out) -> (max |out|, Σout², changed): out = fl(src · scale) (out may be src), as
 * NumPy multiplies float64 (clipping.scale_tensor), measured in the same pass (f64_pass), GIL released. */
static PyObject *f64_scale(PyObject *self, PyObject *args) {
    PyObject *src_obj, *out_obj;
    double scale;
    if (!PyArg_ParseTuple(args, "OdO", &src_obj, &scale, &out_obj)) return NULL;
    Py_buffer src, out;
    if (take_f64(src_obj, &src, "f64_scale") < 0 || take_out(out_obj, &out, &src, "f64_scale") < 0) return NULL;
    double amax, sumsq;
    long long changed;
    Py_BEGIN_ALLOW_THREADS
    f64_pass((const char *)src.buf, (char *)out.buf, src.len / 8, scale, &amax, &sumsq, &changed);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    return Py_BuildValue("(ddL)", amax, sumsq, changed);
}

#ifndef _WIN32
#include <errno.h>
#include <unistd.h>

/* The kernel's copy to or from user memory (`rep movsb`) runs at a third of its speed when the destination
 * lies 1-31 bytes after the source modulo a 4 KiB page (measured on an AMD EPYC, Zen 3: 2.1 against
 * 7 GB/s; the same for pread and pwrite). malloc puts a 1 MiB block 16 bytes into a page, or anywhere
 * once its arena is reused, so whether a tensor's chunks were read at full speed was luck. A read buffer
 * placed at the data's own phase in the page, rounded down to 64 bytes, puts the destination 0-63 bytes
 * *before* the source: never slow. PAGE_PHASE_SLACK bytes of slack make room for any phase. */
#define PAGE_PHASE 4096
#define PAGE_PHASE_SLACK (2 * PAGE_PHASE)

static char *phased(char *page_aligned, long long file_offset) {
    return page_aligned + ((file_offset & (PAGE_PHASE - 1)) & ~(long long)63);
}

/* f32_summaries_fd(fd, offset, count, chunk_elements[, kind[, crc]]) -> list of f32_summary tuples for the
 * `count` float32 values at byte `offset` of file `fd`, one per chunk: each chunk is pread into a reused
 * buffer (cache-resident, 64-byte aligned, at the chunk's phase in a page: see phased) and summarised, all
 * without the GIL. With kind 0 (float16) or 1 (bfloat16) the values are 2-byte half-precision ones,
 * summarised as their float32 values (half_summaries' bits). With `crc` (an int, not None) the result is
 * (that list, zlib.crc32(the bytes read, crc)): the CRC is taken of each chunk while it is in the cache,
 * where a pass of its own reads the file's pages from memory once more (an npz member's check).
 * A file that ends early raises EOFError; a read error raises OSError. */
static PyObject *f32_summaries_fd(PyObject *self, PyObject *args) {
    int fd, kind = -1;
    long long offset;
    Py_ssize_t count, chunk;
    PyObject *crc_obj = Py_None;
    if (!PyArg_ParseTuple(args, "iLnn|iO", &fd, &offset, &count, &chunk, &kind, &crc_obj)) return NULL;
    if (chunk <= 0 || count < 0 || offset < 0) {
        PyErr_SetString(PyExc_ValueError, "bad offset, count or chunk_elements");
        return NULL;
    }
    int with_crc = crc_obj != Py_None;
    uint32_t crc = 0;
    if (with_crc) {
        unsigned long seed = PyLong_AsUnsignedLong(crc_obj);
        if (seed == (unsigned long)-1 && PyErr_Occurred()) return NULL;
        if (seed > 0xFFFFFFFFul) {
            PyErr_SetString(PyExc_ValueError, "crc must be a CRC-32 (0 <= crc < 2**32)");
            return NULL;
        }
        crc = (uint32_t)seed;
    }
    if (kind != -1 && half_kind(kind) < 0) return NULL;
    size_t item = kind == -1 ? sizeof(float) : 2;
    Py_ssize_t nchunks = (count + chunk - 1) / chunk, most = count < chunk ? (count > 0 ? count : 1) : chunk;
    summary_t *out = PyMem_RawMalloc((size_t)(nchunks > 0 ? nchunks : 1) * sizeof(summary_t));
    char *block = PyMem_RawMalloc((size_t)most * item + PAGE_PHASE_SLACK);
    if (out == NULL || block == NULL) {
        PyMem_RawFree(out);
        PyMem_RawFree(block);
        return PyErr_NoMemory();
    }
    char *page = (char *)(((uintptr_t)block + PAGE_PHASE - 1) & ~(uintptr_t)(PAGE_PHASE - 1));
    int err = 0, eof = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t c = 0; c < nchunks && !err && !eof; c++) {
        Py_ssize_t len = count - c * chunk < chunk ? count - c * chunk : chunk;
        size_t want = (size_t)len * item, got = 0;
        long long at = offset + (long long)c * chunk * (long long)item;
        char *buf = phased(page, at);
        while (got < want) {
            ssize_t n = pread(fd, buf + got, want - got, (off_t)(at + (long long)got));
            if (n < 0) {
                if (errno == EINTR) continue;
                err = errno;
                break;
            }
            if (n == 0) {
                eof = 1;
                break;
            }
            got += (size_t)n;
        }
        if (err || eof) break;
        if (with_crc) crc = crc32_with(crc, (const unsigned char *)buf, (Py_ssize_t)want, CRC_SIMD_BEST);
        summarize_kind(chosen, buf, len, kind, &out[c]);
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(block);
    if (err || eof) {
        PyMem_RawFree(out);
        if (err) {
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        PyErr_SetString(PyExc_EOFError, "the file ends before the tensor does");
        return NULL;
    }
    PyObject *list = summaries_to_list(out, nchunks);
    if (list == NULL || !with_crc) return list;
    return Py_BuildValue("(Nk)", list, (unsigned long)crc);
}

/* Whether a buffer's struct format is a native-order 4-byte unsigned integer ("I", "=I", ...; "L" where a
 * C long is 4 bytes): a NumPy uint32 array's. */
static int native_uint32(const char *fmt) {
    if (fmt == NULL) return 0;
    if (fmt[0] == '@' || fmt[0] == '=' || fmt[0] == (PY_LITTLE_ENDIAN ? '<' : '>')) fmt++;
    return (fmt[0] == 'I' || (fmt[0] == 'L' && sizeof(long) == 4)) && fmt[1] == 0;
}

/* Whether a buffer's struct format is one of the 8-byte native codes in `codes` ("l", "<q", "=d", ...). */
static int native_format(const char *fmt, const char *codes, int size) {
    if (fmt == NULL || size != 8) return 0;
    if (fmt[0] == '@' || fmt[0] == '=' || fmt[0] == (PY_LITTLE_ENDIAN ? '<' : '>')) fmt++;
    return fmt[0] != 0 && fmt[1] == 0 && strchr(codes, fmt[0]) != NULL;
}

/* tensor_summaries_fd(fd, items, out) -> -1, or the index of the first item whose read failed: for each row
 * (offset, count, kind) of `items` (int64, k x 3; 0 < count; kind -1 float32, 0 float16, 1 bfloat16) the
 * f32_summary of the `count` values at byte `offset` of `fd`, as ONE chunk, written to row i of `out`
 * (float64, k x 5: min, max, sum, sumsq, zero count), read with pread into a reused buffer at the data's
 * phase in a page; all without the GIL. For a dump's many small tensors: one call instead of one per
 * tensor (each call costs its GIL round trip, a list and a tuple). Rows from the failed index on are left
 * unwritten; the caller reads those tensors again its usual way, which reports the error. With `crcs` (a
 * writable uint32 buffer of k entries, not None), crcs[i] becomes zlib.crc32(item i's bytes, crcs[i]): each
 * item's CRC-32 continued from the seed the caller put there (f32_summaries_fd's crc). */
static PyObject *tensor_summaries_fd(PyObject *self, PyObject *args) {
    int fd;
    PyObject *items_obj, *out_obj, *crcs_obj = Py_None;
    if (!PyArg_ParseTuple(args, "iOO|O", &fd, &items_obj, &out_obj, &crcs_obj)) return NULL;
    Py_buffer items, out, crcs = {0};
    if (PyObject_GetBuffer(items_obj, &items, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&items);
        return NULL;
    }
    int with_crcs = crcs_obj != Py_None;
    if (with_crcs && PyObject_GetBuffer(crcs_obj, &crcs, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&items);
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_ssize_t k = items.len / (3 * 8);
    int ok = native_format(items.format, "ql", 8) && items.itemsize == 8 && items.len == k * 3 * 8
             && native_format(out.format, "d", 8) && out.itemsize == 8 && out.len == k * 5 * 8
             && (!with_crcs || (native_uint32(crcs.format) && crcs.itemsize == 4 && crcs.len == k * 4));
    const long long *it = (const long long *)items.buf;
    Py_ssize_t most = 1;
    for (Py_ssize_t i = 0; ok && i < k; i++) {
        long long off = it[3 * i], count = it[3 * i + 1], kind = it[3 * i + 2];
        if (off < 0 || count <= 0 || (kind != -1 && kind != HALF_F16 && kind != HALF_BF16)) ok = 0;
        else if (count * (kind == -1 ? 4 : 2) > most) most = (Py_ssize_t)(count * (kind == -1 ? 4 : 2));
    }
    if (!ok) {
        PyBuffer_Release(&items);
        PyBuffer_Release(&out);
        if (with_crcs) PyBuffer_Release(&crcs);
        PyErr_SetString(PyExc_ValueError, "tensor_summaries_fd needs int64 (offset, count > 0, kind) rows, a "
                                          "float64 output of 5 columns, one row per item, and crcs None or "
                                          "uint32, one per item");
        return NULL;
    }
    char *block = PyMem_RawMalloc((size_t)most + PAGE_PHASE_SLACK);
    if (block == NULL) {
        PyBuffer_Release(&items);
        PyBuffer_Release(&out);
        if (with_crcs) PyBuffer_Release(&crcs);
        return PyErr_NoMemory();
    }
    uint32_t *crc_out = with_crcs ? (uint32_t *)crcs.buf : NULL;
    char *page = (char *)(((uintptr_t)block + PAGE_PHASE - 1) & ~(uintptr_t)(PAGE_PHASE - 1));
    double *o = (double *)out.buf;
    Py_ssize_t failed = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < k && failed < 0; i++) {
        long long at = it[3 * i], kind = it[3 * i + 2];
        Py_ssize_t len = (Py_ssize_t)it[3 * i + 1];
        size_t want = (size_t)len * (kind == -1 ? 4 : 2), got = 0;
        char *buf = phased(page, at);
        while (got < want) {
            ssize_t n = pread(fd, buf + got, want - got, (off_t)(at + (long long)got));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            got += (size_t)n;
        }
        if (got < want) {
            failed = i;
            break;
        }
        if (crc_out != NULL) crc_out[i] = crc32_with(crc_out[i], (const unsigned char *)buf, (Py_ssize_t)want,
                                                   CRC_SIMD_BEST);
        summary_t one;
        summarize_kind(chosen, buf, len, (int)kind, &one);
        double *row = o + 5 * i;
        row[0] = one.lo;
        row[1] = one.hi;
        row[2] = one.sum;
        row[3] = one.sumsq;
        row[4] = (double)one.zeros;
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(block);
    PyBuffer_Release(&items);
    PyBuffer_Release(&out);
    if (with_crcs) PyBuffer_Release(&crcs);
    return PyLong_FromSsize_t(failed);
}
#endif

/* f32_sumsq_each(sequence of buffers) -> list of Σx² (float64), one per C-contiguous float32 buffer, computed
 * with the GIL released after all buffers are taken: the SIMD loop's float32 partial sums at every length
 * (f32_summary's above SMALL_CHUNK elements; global_norm's documented ~1e-7 per tensor). For many small
 * tensors: no Python runs per tensor. */
static PyObject *f32_sumsq_each(PyObject *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "f32_sumsq_each needs a sequence of float32 buffers");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer *views = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof(Py_buffer));
    double *sums = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (views == NULL || sums == NULL) {
        PyMem_Free(views);
        PyMem_Free(sums);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    Py_ssize_t taken = 0;
    PyObject *result = NULL;
    for (; taken < n; taken++) {
        if (take_f32(PySequence_Fast_GET_ITEM(seq, taken), &views[taken], "f32_sumsq_each") < 0) goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        float lo, hi;
        double sum;
        long long zeros;
        chosen->summary((const float *)views[i].buf, views[i].len / 4, &lo, &hi, &sum, &sums[i], &zeros);
    }
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    for (Py_ssize_t i = 0; result != NULL && i < n; i++) {
        PyObject *f = PyFloat_FromDouble(sums[i]);
        if (f == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, i, f);
    }
done:
    for (Py_ssize_t i = 0; i < taken; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(sums);
    Py_DECREF(seq);
    return result;
}

/* f32_scale(src, scale, out) -> (sumsq of out, changed count); src and out C-contiguous float32 buffers of
 * the same length (out writable; it may be src itself), scale a Python float rounded to float32 here. */
static PyObject *scale_with(PyObject *src_obj, double scale, PyObject *out_obj, const width_t *width) {
    Py_buffer src, out;
    if (take_f32(src_obj, &src, "f32_scale") < 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (out.itemsize != 4 || !native_float32(out.format) || out.len != src.len) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_TypeError, "f32_scale needs a writable float32 output as long as the input");
        return NULL;
    }
    double sumsq = 0.0;
    long long changed = 0;
    float s = (float)scale;
    Py_BEGIN_ALLOW_THREADS
    if (src.len / 4 < SMALL_CHUNK)
        f32_scale_small((const float *)src.buf, (float *)out.buf, src.len / 4, s, &sumsq, &changed);
    else
        width->scale((const float *)src.buf, (float *)out.buf, src.len / 4, s, &sumsq, &changed);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    return Py_BuildValue("(dL)", sumsq, changed);
}

static PyObject *f32_scale(PyObject *self, PyObject *args) {
    PyObject *src_obj, *out_obj;
    double scale;
    if (!PyArg_ParseTuple(args, "OdO", &src_obj, &scale, &out_obj)) return NULL;
    return scale_with(src_obj, scale, out_obj, chosen);
}

/* For tests: the build of `lanes` native lanes, or None (ValueError set) if not built or not run by this CPU. */
static const width_t *width_for(int lanes) {
    for (int k = 0; k < N_WIDTHS; k++)
        if (widths[k].lanes == lanes && runs_here(&widths[k])) return &widths[k];
    PyErr_Format(PyExc_ValueError, "no %d-lane build runs on this machine", lanes);
    return NULL;
}

static PyObject *widths_here(PyObject *self, PyObject *unused) {
    PyObject *list = PyList_New(0);
    for (int k = 0; list != NULL && k < N_WIDTHS; k++) {
        if (!runs_here(&widths[k])) continue;
        PyObject *v = PyLong_FromLong(widths[k].lanes);
        if (v == NULL || PyList_Append(list, v) < 0) Py_CLEAR(list);
        Py_XDECREF(v);
    }
    return list;
}

static PyObject *f32_summary_width(PyObject *self, PyObject *args) {
    PyObject *obj;
    int lanes;
    if (!PyArg_ParseTuple(args, "Oi", &obj, &lanes)) return NULL;
    const width_t *width = width_for(lanes);
    return width == NULL ? NULL : summary_with(obj, width);
}

static PyObject *f32_scale_width(PyObject *self, PyObject *args) {
    PyObject *src_obj, *out_obj;
    double scale;
    int lanes;
    if (!PyArg_ParseTuple(args, "OdOi", &src_obj, &scale, &out_obj, &lanes)) return NULL;
    const width_t *width = width_for(lanes);
    return width == NULL ? NULL : scale_with(src_obj, scale, out_obj, width);
}

static PyObject *f32_to_half_width_py(PyObject *self, PyObject *args) {
    PyObject *src_obj, *out_obj;
    int kind, lanes;
    if (!PyArg_ParseTuple(args, "OOii", &src_obj, &out_obj, &kind, &lanes) || half_kind(kind) < 0)
        return NULL;
    const width_t *width = width_for(lanes);
    if (width == NULL) return NULL;
    Py_buffer src, out;
    if (take_f32(src_obj, &src, "f32_to_half_width") < 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (out.len != src.len / 2) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "f32_to_half_width needs a 2-byte output of the input's length");
        return NULL;
    }
    f32_to_half_with(width, (const float *)src.buf, (uint16_t *)out.buf, src.len / 4, kind);
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* half_scale_width(src, scale, out, kind, lanes): half_scale by that width's build (tests). */
static PyObject *half_scale_width(PyObject *self, PyObject *args) {
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (n != 5) {
        PyErr_SetString(PyExc_TypeError, "half_scale_width(src, scale, out, kind, lanes)");
        return NULL;
    }
    int lanes = (int)PyLong_AsLong(PyTuple_GET_ITEM(args, 4));
    if (lanes == -1 && PyErr_Occurred()) return NULL;
    const width_t *width = width_for(lanes);
    if (width == NULL) return NULL;
    PyObject *first = PyTuple_GetSlice(args, 0, 4);
    if (first == NULL) return NULL;
    PyObject *r = half_scale_py(first, width);
    Py_DECREF(first);
    return r;
}

static PyObject *half_summaries_width(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t chunk;
    int kind, lanes;
    if (!PyArg_ParseTuple(args, "Onii", &obj, &chunk, &kind, &lanes)) return NULL;
    const width_t *width = width_for(lanes);
    return width == NULL || half_kind(kind) < 0 ? NULL : summaries_with(obj, chunk, kind, width);
}

static PyObject *half_to_f32_width(PyObject *self, PyObject *args) {
    PyObject *src_obj, *out_obj;
    int kind, lanes;
    if (!PyArg_ParseTuple(args, "OOii", &src_obj, &out_obj, &kind, &lanes)) return NULL;
    const width_t *width = width_for(lanes);
    return width == NULL ? NULL : half_widen_with(src_obj, out_obj, kind, width);
}

/* crc32_combine(crc1, crc2, len2) -> zlib's crc32_combine: zlib.crc32(a + b) from crc1 = zlib.crc32(a),
 * crc2 = zlib.crc32(b) and len2 = len(b) (the CRCs of an npz member's pieces, read on two threads). */
static PyObject *crc32_combine_py(PyObject *self, PyObject *args) {
    unsigned long crc1, crc2;
    unsigned long long len2;
    if (!PyArg_ParseTuple(args, "kkK", &crc1, &crc2, &len2)) return NULL;
    if (crc1 > 0xFFFFFFFFul || crc2 > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_ValueError, "crc32_combine: a CRC-32 is 0 <= crc < 2**32");
        return NULL;
    }
    return PyLong_FromUnsignedLong(crc32_combine((uint32_t)crc1, (uint32_t)crc2, (uint64_t)len2));
}

static PyMethodDef methods[] = {
    {"crc32_combine", crc32_combine_py, METH_VARARGS,
     "crc32_combine(crc1, crc2, len2) -> zlib.crc32(a + b) from crc1 = zlib.crc32(a), crc2 = zlib.crc32(b)\n"
     "and len2 = len(b)."},
    {"f64_summary", f64_summary, METH_O,
     "f64_summary(src) -> (max |x| (NaN if any x is NaN), sum of squares) of C-contiguous float64 values,\n"
     "in a fixed order (eight running sums), no GIL held."},
    {"f64_scale", f64_scale, METH_VARARGS,
     "f64_scale(src, scale, out) -> (max |out|, sum of squares of out, changed count): out = src * scale\n"
     "in float64 (out may be src), measured as f64_summary(out) measures it, no GIL held."},
    {"widths_here", widths_here, METH_NOARGS,
     "widths_here() -> the native vector widths (float lanes) built and runnable here, widest (the one used) first."},
    {"f32_summary_width", f32_summary_width, METH_VARARGS,
     "f32_summary_width(buffer, lanes) -> f32_summary(buffer) computed by the build of that width (for tests)."},
    {"f32_scale_width", f32_scale_width, METH_VARARGS,
     "f32_scale_width(src, scale, out, lanes) -> f32_scale(src, scale, out) by the build of that width (for tests)."},
    {"half_summaries_width", half_summaries_width, METH_VARARGS,
     "half_summaries_width(buffer, chunk_elements, kind, lanes) -> half_summaries(...) by the build of that\n"
     "width (for tests)."},
    {"half_to_f32_width", half_to_f32_width, METH_VARARGS,
     "half_to_f32_width(src, out, kind, lanes) -> half_to_f32(src, out, kind) by the build of that width\n"
     "(for tests)."},
    {"f32_scale", f32_scale, METH_VARARGS,
     "f32_scale(src, scale, out) -> (sum of squares of out, changed count): out = src * float32(scale) in one\n"
     "pass, GIL released; the sum of squares has the bits of f32_summary(out)[3]."},
    {"f32_sumsq_each", f32_sumsq_each, METH_O,
     "f32_sumsq_each(buffers) -> [sum of squares of each C-contiguous float32 buffer], GIL released."},
#ifndef _WIN32
    {"tensor_summaries_fd", tensor_summaries_fd, METH_VARARGS,
     "tensor_summaries_fd(fd, items, out[, crcs]) -> -1 or the first failed index: out[i] = (min, max, sum,\n"
     "sumsq, zeros) of the count values (kind -1 float32, 0 float16, 1 bfloat16) at byte offset of fd, one\n"
     "chunk per (offset, count, kind) row of items (int64), all without the GIL; crcs (uint32): each\n"
     "item's CRC-32 continued from the seed in it."},
    {"f32_summaries_fd", f32_summaries_fd, METH_VARARGS,
     "f32_summaries_fd(fd, offset, count, chunk_elements[, kind[, crc]]) -> f32_summary of each chunk of the\n"
     "count float32 values (kind 0: float16, 1: bfloat16, widened) at byte offset of fd, read with pread\n"
     "into a cache-resident buffer, all without the GIL; with crc (an int), (that list, zlib.crc32(the bytes\n"
     "read, crc))."},
#endif
    {"half_scale", half_scale, METH_VARARGS,
     "half_scale(src, scale, out, kind) -> (sum of squares of out, changed count):\n"
     "out = src * float32(scale) rounded to float16 (kind 0) or bfloat16 (kind 1), uint16 views, no GIL\n"
     "held."},
    {"clip_values", clip_values, METH_VARARGS,
     "clip_values(src, lo, hi, out, kind) -> (changed, non-finite): clip_by_value of float32 (kind -1;\n"
     "lo, hi floats), float64 (kind -2) or float16/bfloat16 values (kind 0/1, uint16 views; lo, hi their\n"
     "bits) into out,\n"
     "no GIL held."},
    {"f32_scale_slices", f32_scale_slices, METH_VARARGS,
     "f32_scale_slices(src, scales, out, by_row) -> changed count: half_scale_slices for float32 values\n"
     "(float32 products; negative scales keep their slices), no GIL held."},
    {"column_sumsq", column_sumsq, METH_VARARGS,
     "column_sumsq(src, acc, kind) -> None: acc[j] += x[r, j]**2 in float64 for each row r of src in order\n"
     "(rows of len(acc) float32 values, kind -1, or float16/bfloat16 ones, kind 0/1, as uint16), no GIL held."},
    {"half_scale_slices", half_scale_slices, METH_VARARGS,
     "half_scale_slices(src, scales, out, kind, by_row) -> changed count: half_scale with a float32 scale\n"
     "per column of src's rows of len(scales) elements, or (by_row) per row of len(src) / len(scales)\n"
     "elements (negative: the slice kept as it is), no GIL held."},
    {"half_scale_width", half_scale_width, METH_VARARGS,
     "half_scale_width(src, scale, out, kind, lanes): half_scale by one vector width's build (tests)."},
    {"f32_to_half_width", f32_to_half_width_py, METH_VARARGS,
     "f32_to_half_width(src, out, kind, lanes) -> None: float32 src rounded into out (uint16) by that\n"
     "width's build (for tests)."},
    {"half_summaries", half_summaries, METH_VARARGS,
     "half_summaries(buffer, chunk_elements, kind) -> f32_summaries of the buffer's float16 (kind 0) or\n"
     "bfloat16 (kind 1) values (a uint16 view) widened to float32, chunk by chunk, without the GIL."},
    {"f32_summaries", f32_summaries, METH_VARARGS,
     "f32_summaries(buffer, chunk_elements) -> [f32_summary(chunk) for each chunk of the buffer], in one call\n"
     "without the GIL."},
    {"f32_summary", f32_summary, METH_O,
     "f32_summary(buffer) -> (min, max, sum, sumsq, zero_count) of a C-contiguous float32 buffer in one\n"
     "pass. min/max skip NaN; the sums are float32 per lane run of 32 elements added in float64, in\n"
     "float64 outright below 4096 elements (NaN or inf when the buffer is not finite); zero_count counts\n"
     "x == 0."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gradtool.core._kernels",
                                    "Optional compiled kernels (see _kernels.c).", -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) {
    crc32_setup();
#ifdef GT_X86_WIDTHS
    __builtin_cpu_init();
#endif
    chosen = &widths[N_WIDTHS - 1];
    for (int k = 0; k < N_WIDTHS; k++) {
        if (runs_here(&widths[k])) {
            chosen = &widths[k];
            break;
        }
    }
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "SIMD", chosen->name) < 0) Py_CLEAR(m);
    return m;
}
