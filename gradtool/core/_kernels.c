/* gradtool.core._kernels: the one-pass chunk kernel of gradtool/core/stats.py and norms.py.
 *
 * f32_summary(buffer) -> (min, max, sum, sumsq, zero_count) of a C-contiguous float32 buffer, in ONE pass
 * (the NumPy fallback takes five: min, max, x @ ones, row-blocked vecdot, count_nonzero(x == 0)):
 *   min, max   over the non-NaN elements (NaN is skipped; +-inf shows up here),
 *   sum        Σ x, and sumsq Σ x²: float32 partial sums of at most BLOCK/32 elements per SIMD lane, then
 *              added in float64 lanes; NaN whenever the buffer holds a NaN (or both infinities) and inf
 *              when it holds an infinity (or a float32 partial sum overflows, |x| > ~1e19 for sumsq), so
 *              finite sums prove a finite buffer,
 *   zero_count #{x == 0} (-0.0 included).
 * tests/core/test_kernels.py checks it against a float64 reference (math.fsum) and against the fallback.
 *
 * Written with GCC/Clang vector extensions (16 float lanes; AVX-512 and AVX2 clones on x86-64 Linux, chosen
 * at run time), so it needs no intrinsics and builds on any architecture; the GIL is released during the
 * loop, so two threads run it on two cores. The extension is optional: if it does not build, gradtool uses
 * the NumPy passes (same statistics; norms differ in the last bits).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

#define BLOCK 1024

/* 16-lane vectors: one AVX-512 register, two AVX2 or four SSE/NEON registers, whatever the build has. */
typedef float vf __attribute__((vector_size(64)));
typedef int vi __attribute__((vector_size(64)));
typedef float vf8 __attribute__((vector_size(32)));
typedef double vd __attribute__((vector_size(64)));
#define W 16

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define GT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define GT_CLONES
#endif

static inline vf select_f(vi mask, vf a, vf b) { /* mask ? a : b, lane by lane */
    return (vf)(((vi)a & mask) | ((vi)b & ~mask));
}

/* A block's 16 float32 partial sums added into two float64 accumulators (lanes 0-7 and 8-15). */
static inline void widen_add(vf v, vd *low, vd *high) {
    vf8 h;
    memcpy(&h, &v, sizeof h);
    *low += __builtin_convertvector(h, vd);
    memcpy(&h, (const char *)&v + sizeof h, sizeof h);
    *high += __builtin_convertvector(h, vd);
}

/* Two independent sets of accumulators (2W = 32 elements a step), so that the loop is not bound by the
 * latency of one chain of vector additions (measured: 10 -> 39 GB/s on a 1 MiB chunk, AVX-512). Float32
 * partial sums run over BLOCK elements (BLOCK/32 = 32 per lane), then go to float64 lanes. Built with
 * -ffp-contract=off: x*x and + are separate IEEE operations lane by lane, so every clone (AVX-512, AVX2,
 * SSE) gives the same bits. */
GT_CLONES
static void f32_summary_loop(const float *x, Py_ssize_t n, float *lo_out, float *hi_out, double *sum_out,
                             double *sumsq_out, long long *zeros_out) {
    vf pinf;
    for (int k = 0; k < W; k++) pinf[k] = INFINITY;
    vf lo0 = pinf, lo1 = pinf, hi0 = -pinf, hi1 = -pinf;
    vd sum_a = {0}, sum_b = {0}, sq_a = {0}, sq_b = {0};
    long long zeros = 0;
    Py_ssize_t i = 0;
    Py_ssize_t vec_end = n - n % (2 * W);
    while (i < vec_end) {
        Py_ssize_t end = i + BLOCK < vec_end ? i + BLOCK : vec_end;
        vf s0 = {0}, s1 = {0}, q0 = {0}, q1 = {0};
        vi z0 = {0}, z1 = {0};
        for (; i < end; i += 2 * W) {
            vf a, b;
            memcpy(&a, x + i, sizeof a); /* unaligned loads */
            memcpy(&b, x + i + W, sizeof b);
            lo0 = select_f(a < lo0, a, lo0); /* NaN compares false: skipped */
            lo1 = select_f(b < lo1, b, lo1);
            hi0 = select_f(a > hi0, a, hi0);
            hi1 = select_f(b > hi1, b, hi1);
            z0 -= (a == 0); /* true is -1 */
            z1 -= (b == 0);
            s0 += a;
            s1 += b;
            q0 += a * a;
            q1 += b * b;
        }
        widen_add(s0 + s1, &sum_a, &sum_b);
        widen_add(q0 + q1, &sq_a, &sq_b);
        vi zc = z0 + z1;
        for (int k = 0; k < W; k++) zeros += zc[k];
    }
    double total = 0.0, total_sq = 0.0;
    vd sum_v = sum_a + sum_b, sq_v = sq_a + sq_b;
    for (int k = 0; k < W / 2; k++) {
        total += sum_v[k];
        total_sq += sq_v[k];
    }
    float slo = INFINITY, shi = -INFINITY;
    for (int k = 0; k < W; k++) {
        if (lo0[k] < slo) slo = lo0[k];
        if (lo1[k] < slo) slo = lo1[k];
        if (hi0[k] > shi) shi = hi0[k];
        if (hi1[k] > shi) shi = hi1[k];
    }
    for (; i < n; i++) { /* the tail (< 32 elements), in float64 */
        float v = x[i];
        if (v < slo) slo = v;
        if (v > shi) shi = v;
        zeros += (v == 0.0f);
        total += (double)v;
        total_sq += (double)v * (double)v;
    }
    *lo_out = slo;
    *hi_out = shi;
    *sum_out = total;
    *sumsq_out = total_sq;
    *zeros_out = zeros;
}

/* "f", "@f", "=f", or the explicit byte order of this machine ("<f" here; NumPy's '<f4' views say so). */
static int native_float32(const char *fmt) {
    if (fmt == NULL) return 0;
#if PY_LITTLE_ENDIAN
    const char own = '<';
#else
    const char own = '>';
#endif
    if (fmt[0] == '@' || fmt[0] == '=' || fmt[0] == own || (fmt[0] == '!' && own == '>')) fmt++;
    return strcmp(fmt, "f") == 0;
}

/* Take `obj`'s buffer into `view` if it is C-contiguous native float32; else set TypeError and return -1. */
static int take_f32(PyObject *obj, Py_buffer *view, const char *who) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (view->itemsize != 4 || !native_float32(view->format)) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s needs C-contiguous float32 buffers", who);
        return -1;
    }
    return 0;
}

static PyObject *f32_summary(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (take_f32(arg, &view, "f32_summary") < 0) return NULL;
    Py_ssize_t n = view.len / 4;
    float lo = INFINITY, hi = -INFINITY;
    double total = 0.0, total_sq = 0.0;
    long long zeros = 0;
    Py_BEGIN_ALLOW_THREADS
    f32_summary_loop((const float *)view.buf, n, &lo, &hi, &total, &total_sq, &zeros);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("(ddddL)", (double)lo, (double)hi, total, total_sq, zeros);
}

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

static PyObject *f32_summaries(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t chunk;
    if (!PyArg_ParseTuple(args, "On", &obj, &chunk)) return NULL;
    if (chunk <= 0) {
        PyErr_SetString(PyExc_ValueError, "chunk_elements must be positive");
        return NULL;
    }
    Py_buffer view;
    if (take_f32(obj, &view, "f32_summaries") < 0) return NULL;
    Py_ssize_t n = view.len / 4, count = (n + chunk - 1) / chunk;
    summary_t *out = PyMem_RawMalloc((size_t)(count > 0 ? count : 1) * sizeof(summary_t));
    if (out == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    const float *x = (const float *)view.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t c = 0; c < count; c++) {
        Py_ssize_t start = c * chunk, len = n - start < chunk ? n - start : chunk;
        f32_summary_loop(x + start, len, &out[c].lo, &out[c].hi, &out[c].sum, &out[c].sumsq, &out[c].zeros);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return summaries_to_list(out, count);
}

#ifndef _WIN32
#include <errno.h>
#include <unistd.h>

/* f32_summaries_fd(fd, offset, count, chunk_elements) -> list of f32_summary tuples for the `count`
 * float32 values at byte `offset` of file `fd`, one per chunk: each chunk is pread into a reused buffer
 * (cache-resident, aligned, whatever the file offset's alignment) and summarised, all without the GIL.
 * A file that ends early raises EOFError; a read error raises OSError. */
static PyObject *f32_summaries_fd(PyObject *self, PyObject *args) {
    int fd;
    long long offset;
    Py_ssize_t count, chunk;
    if (!PyArg_ParseTuple(args, "iLnn", &fd, &offset, &count, &chunk)) return NULL;
    if (chunk <= 0 || count < 0 || offset < 0) {
        PyErr_SetString(PyExc_ValueError, "bad offset, count or chunk_elements");
        return NULL;
    }
    Py_ssize_t nchunks = (count + chunk - 1) / chunk;
    summary_t *out = PyMem_RawMalloc((size_t)(nchunks > 0 ? nchunks : 1) * sizeof(summary_t));
    float *buf = PyMem_RawMalloc((size_t)(count < chunk ? (count > 0 ? count : 1) : chunk) * sizeof(float));
    if (out == NULL || buf == NULL) {
        PyMem_RawFree(out);
        PyMem_RawFree(buf);
        return PyErr_NoMemory();
    }
    int err = 0, eof = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t c = 0; c < nchunks && !err && !eof; c++) {
        Py_ssize_t len = count - c * chunk < chunk ? count - c * chunk : chunk;
        size_t want = (size_t)len * sizeof(float), got = 0;
        long long at = offset + (long long)c * chunk * (long long)sizeof(float);
        while (got < want) {
            ssize_t n = pread(fd, (char *)buf + got, want - got, (off_t)(at + (long long)got));
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
        if (!err && !eof)
            f32_summary_loop(buf, len, &out[c].lo, &out[c].hi, &out[c].sum, &out[c].sumsq, &out[c].zeros);
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(buf);
    if (err || eof) {
        PyMem_RawFree(out);
        if (err) {
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        PyErr_SetString(PyExc_EOFError, "the file ends before the tensor does");
        return NULL;
    }
    return summaries_to_list(out, nchunks);
}
#endif

/* f32_sumsq_each(sequence of buffers) -> list of Σx² (float64), one per C-contiguous float32 buffer, computed
 * with the GIL released after all buffers are taken (the same arithmetic as f32_summary's sumsq). For
 * many small tensors: no Python runs per tensor. */
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
        f32_summary_loop((const float *)views[i].buf, views[i].len / 4, &lo, &hi, &sum, &sums[i], &zeros);
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

/* The scale pass of global-norm clipping, fused: out[i] = x[i] * scale (one float32 multiply, as
 * clipping.scale_tensor does with a float32 scale), and in the same pass Σ out² with EXACTLY the arithmetic
 * of f32_summary_loop's sumsq (same lanes, blocks and order: the bits of f32_summary(out)[3]) and the number
 * of elements whose value changed (out != x, NaN -> NaN not counted). One read and one write of memory
 * instead of the five passes of multiply, compare, count, and norm. */
GT_CLONES
static void f32_scale_loop(const float *x, float *y, Py_ssize_t n, float scale, double *sumsq_out,
                           long long *changed_out) {
    vf sv;
    for (int k = 0; k < W; k++) sv[k] = scale;
    vd sq_a = {0}, sq_b = {0};
    long long changed = 0;
    Py_ssize_t i = 0;
    Py_ssize_t vec_end = n - n % (2 * W);
    while (i < vec_end) {
        Py_ssize_t end = i + BLOCK < vec_end ? i + BLOCK : vec_end;
        vf q0 = {0}, q1 = {0};
        vi c0 = {0}, c1 = {0};
        for (; i < end; i += 2 * W) {
            vf a, b;
            memcpy(&a, x + i, sizeof a);
            memcpy(&b, x + i + W, sizeof b);
            vf oa = a * sv, ob = b * sv;
            memcpy(y + i, &oa, sizeof oa);
            memcpy(y + i + W, &ob, sizeof ob);
            /* differs, and not NaN on both sides: x NaN makes x*scale NaN, so "both NaN" is "x NaN" and
             * changed = #(out != x) - #(x NaN). Two counters, not one masked AND: GCC 12 turns an AND of
             * two comparisons into scalar code in the AVX-512 clone (measured 25x slower). */
            c0 -= (oa != a);
            c0 += (a != a);
            c1 -= (ob != b);
            c1 += (b != b);
            q0 += oa * oa;
            q1 += ob * ob;
        }
        widen_add(q0 + q1, &sq_a, &sq_b);
        vi cc = c0 + c1;
        for (int k = 0; k < W; k++) changed += cc[k];
    }
    double total_sq = 0.0;
    vd sq_v = sq_a + sq_b;
    for (int k = 0; k < W / 2; k++) total_sq += sq_v[k];
    for (; i < n; i++) { /* the tail, in float64, as f32_summary_loop */
        float v = x[i], o = v * scale;
        y[i] = o;
        changed += (o != v) && !(o != o && v != v);
        total_sq += (double)o * (double)o;
    }
    *sumsq_out = total_sq;
    *changed_out = changed;
}

/* f32_scale(src, scale, out) -> (sumsq of out, changed count); src and out C-contiguous float32 buffers of
 * the same length (out writable; it may be src itself), scale a Python float rounded to float32 here. */
static PyObject *f32_scale(PyObject *self, PyObject *args) {
    PyObject *src_obj, *out_obj;
    double scale;
    if (!PyArg_ParseTuple(args, "OdO", &src_obj, &scale, &out_obj)) return NULL;
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
    f32_scale_loop((const float *)src.buf, (float *)out.buf, src.len / 4, s, &sumsq, &changed);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    return Py_BuildValue("(dL)", sumsq, changed);
}

static PyMethodDef methods[] = {
    {"f32_scale", f32_scale, METH_VARARGS,
     "f32_scale(src, scale, out) -> (sum of squares of out, changed count): out = src * float32(scale) in one\n"
     "pass, GIL released; the sum of squares has the bits of f32_summary(out)[3]."},
    {"f32_sumsq_each", f32_sumsq_each, METH_O,
     "f32_sumsq_each(buffers) -> [sum of squares of each C-contiguous float32 buffer], GIL released."},
#ifndef _WIN32
    {"f32_summaries_fd", f32_summaries_fd, METH_VARARGS,
     "f32_summaries_fd(fd, offset, count, chunk_elements) -> f32_summary of each chunk of the count float32\n"
     "values at byte offset of fd, read with pread into a cache-resident buffer, all without the GIL."},
#endif
    {"f32_summaries", f32_summaries, METH_VARARGS,
     "f32_summaries(buffer, chunk_elements) -> [f32_summary(chunk) for each chunk of the buffer], in one call\n"
     "without the GIL."},
    {"f32_summary", f32_summary, METH_O,
     "f32_summary(buffer) -> (min, max, sum, zero_count) of a C-contiguous float32 buffer in one pass.\n"
     "min/max skip NaN; sum is float32 per block of 4096 elements added in float64 (NaN or inf when the\n"
     "buffer is not finite); zero_count counts x == 0."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gradtool.core._kernels",
                                    "Optional compiled kernels (see _kernels.c).", -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
