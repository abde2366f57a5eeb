/* Many small raw-deflate streams (an npz's compressed members) inflated in one call, without the GIL.
 *
 *   inflate_raw(packed, table, out) -> bytes
 *
 * `packed`: the members' compressed bytes (one pread of the file's span); `table`: six int64 a member,
 * (src, src_len, head_len, dst, dst_len, crc): the member's raw deflate stream is packed[src:src+src_len];
 * it must inflate to exactly head_len + dst_len bytes and end there (nothing after its final block), of
 * which the first head_len (the .npy header) go to a scratch buffer and the rest to out[dst:dst+dst_len];
 * their CRC-32 (zlib's crc32_z) must be `crc`. Returns one byte a member: 0 it passed, 1 the stream is
 * bad, holds more or less or has bytes after its end, 2 the CRC differs. A failed member's bytes in `out`
 * are unspecified: the caller reads it its usual way, which says what is wrong (this only speeds up a
 * success). Offsets outside the buffers raise ValueError before any work.
 *
 * Why: 20,000 members of 4-20 KB, each inflated by one Python call, spent about as long in the calls'
 * Python as in zlib, and two threads doing so convoyed on the GIL; one call a run of members lets go of
 * it for the whole run, so a worker thread inflates the next run while the caller writes this one.
 * Linked to zlib (the setup's `libraries`); an optional extension: without zlib's header it is not built
 * and the Python path (python-isal or zlib, a member a call) does the work. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#define FIELDS 6
#define HEAD_MAX (1 << 16) /* a .npy header longer than this is left to the Python path (status 1) */

enum { PASSED = 0, BAD_STREAM = 1, BAD_CRC = 2 };

/* Inflate `n` bytes of output from the stream into `dst`: Z_OK while the stream goes on, Z_STREAM_END at its
 * end (having made exactly `n` bytes then), anything else an error. zlib's counts are 32-bit: fed in pieces. */
static int inflate_to(z_stream *z, unsigned char *dst, int64_t n, int64_t *made) {
    int rc = Z_OK;
    *made = 0;
    while (*made < n) {
        uInt piece = (uInt)(n - *made > (1 << 30) ? 1 << 30 : n - *made);
        z->next_out = dst + *made;
        z->avail_out = piece;
        rc = inflate(z, Z_NO_FLUSH);
        *made += piece - z->avail_out;
        if (rc != Z_OK) break;
        if (z->avail_out != 0 && z->avail_in == 0) return Z_BUF_ERROR; /* input ended before the output */
    }
    return rc;
}

/* One member (see the top): PASSED, BAD_STREAM or BAD_CRC. `z` was initialised for raw deflate. */
static int inflate_member(z_stream *z, const unsigned char *src, int64_t src_len, unsigned char *head,
                          int64_t head_len, unsigned char *dst, int64_t dst_len, uint32_t crc) {
    if (inflateReset(z) != Z_OK) return BAD_STREAM;
    z->next_in = (unsigned char *)src;
    z->avail_in = 0;
    int64_t left = src_len, made = 0;
    /* zlib's input count is 32-bit too: members here are small, larger ones go to the Python path */
    if (left > (int64_t)0x7FFFFFFF) return BAD_STREAM;
    z->avail_in = (uInt)left;
    int rc = inflate_to(z, head, head_len, &made);
    if (made != head_len || (rc != Z_OK && !(rc == Z_STREAM_END && dst_len == 0))) return BAD_STREAM;
    if (dst_len > 0) {
        rc = inflate_to(z, dst, dst_len, &made);
        if (made != dst_len || (rc != Z_OK && rc != Z_STREAM_END)) return BAD_STREAM;
    }
    if (rc != Z_STREAM_END) { /* the output is full: the stream must end here, with no byte more */
        unsigned char extra;
        z->next_out = &extra;
        z->avail_out = 1;
        rc = inflate(z, Z_FINISH);
        if (rc != Z_STREAM_END || z->avail_out != 1) return BAD_STREAM;
    }
    if (z->avail_in != 0) return BAD_STREAM; /* bytes after the stream's end */
    uLong got = crc32_z(crc32_z(0, head, (z_size_t)head_len), dst, (z_size_t)dst_len);
    return got == crc ? PASSED : BAD_CRC;
}

static PyObject *inflate_raw(PyObject *self, PyObject *args) {
    Py_buffer packed, table, out;
    if (!PyArg_ParseTuple(args, "y*y*w*", &packed, &table, &out)) return NULL;
    PyObject *result = NULL;
    unsigned char *head = NULL;
    if (table.len % (FIELDS * (Py_ssize_t)sizeof(int64_t)) != 0) {
        PyErr_SetString(PyExc_ValueError, "table: six int64 a member");
        goto done;
    }
    Py_ssize_t n = table.len / (FIELDS * (Py_ssize_t)sizeof(int64_t));
    const unsigned char *t = table.buf;
    int64_t head_max = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t f[FIELDS];
        memcpy(f, t + i * FIELDS * sizeof(int64_t), sizeof f);
        if (f[0] < 0 || f[1] < 0 || f[0] > packed.len - f[1] || f[2] < 0 || f[3] < 0 || f[4] < 0 ||
            f[3] > out.len - f[4] || f[5] < 0 || f[5] > 0xFFFFFFFFLL) {
            PyErr_Format(PyExc_ValueError, "table row %zd is outside the buffers", i);
            goto done;
        }
        if (f[2] <= HEAD_MAX && f[2] > head_max) head_max = f[2];
    }
    result = PyBytes_FromStringAndSize(NULL, n);
    head = PyMem_RawMalloc((size_t)head_max + 1);
    if (result == NULL || head == NULL) {
        Py_CLEAR(result);
        if (head == NULL) PyErr_NoMemory();
        goto done;
    }
    char *status = PyBytes_AS_STRING(result);
    int init_failed = 0;
    Py_BEGIN_ALLOW_THREADS
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK) {
        init_failed = 1;
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t f[FIELDS];
            memcpy(f, t + i * FIELDS * sizeof(int64_t), sizeof f);
            status[i] = (char)(f[2] > HEAD_MAX ? BAD_STREAM
                               : inflate_member(&z, (const unsigned char *)packed.buf + f[0], f[1], head, f[2],
                                                (unsigned char *)out.buf + f[3], f[4], (uint32_t)f[5]));
        }
        inflateEnd(&z);
    }
    Py_END_ALLOW_THREADS
    if (init_failed) {
        Py_CLEAR(result);
        PyErr_NoMemory();
    }
done:
    PyMem_RawFree(head);
    PyBuffer_Release(&packed);
    PyBuffer_Release(&table);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"inflate_raw", inflate_raw, METH_VARARGS,
     "inflate_raw(packed, table, out) -> bytes: raw deflate members inflated into out (see the source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gradtool.io._inflate_many",
                                    "Many small raw-deflate members inflated in one call, without the GIL.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__inflate_many(void) {
    return PyModule_Create(&module);
}
