/* gradtool.io._logscan: the optional compiled reader of W&B run-log history rows (gradtool/io/wandb_log.py).
 *
 * wandb_block(block, at) -> (stop, rows, keys, items) reads, from byte `at` of one 32 KiB block of a W&B
 * run log (a LevelDB-style log: records [crc32 u32][length u16][type u8][data]), the whole (FULL) records
 * that follow one another there, as the Python reader does: each record's CRC-32 (zlib's, seeded with the
 * type byte) checked; a protobuf Record whose first length-delimited field 2 (Record.history) is a
 * HistoryRecord gives a row of its numeric items, any other record none. It reads only what wandb writes:
 *   items laid out as  0a L 0a K <key> 82 01 V <value_json>  (every length one byte), the layout the Python
 *   reader's fast path reads (history_rows), with values that are JSON numbers, NaN, Infinity or
 *   -Infinity (numbers) or that do not start like a number (left out: images, tables, strings);
 *   the step  12 L 08 <varint>  (HistoryStep.num), given as the item "_step".
 * It stops, returning `stop`, before the first record it does not read so: a record of another type (the
 * parts of a record split over blocks), a CRC that does not match, a record running past the block, a
 * record or item of another layout, a value it cannot classify exactly (a number with an underscore, an
 * integer of more than 15 digits), or more than MAX_KEYS distinct keys. The Python reader reads that
 * record and calls again after it; `stop` is -1 when the rest of the block is zeros (unused), and the
 * block's end when it read everything. So the rows are exactly the Python reader's: stricter here is only
 * slower, never different (tests/suggest/test_wandb.py property-tests the two on generated logs).
 *
 * rows: how many history rows it read; keys: the distinct item keys it met, as bytes, in first-seen
 * order; items: packed (double value, int32 row, int32 key << 1 | is_int) records, in logging order (row
 * counted from 0 in this call, key an index into keys, is_int when the value's JSON was all digits, as
 * Python's int() reads it). Values: integers exactly; other numbers with Python's own float() parser
 * (PyOS_string_to_double), or exactly with one IEEE operation when they have at most 15 significant digits
 * and a power of ten at most 10^22 (Clinger's fast path): the same doubles either way.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 32768
#define HEADER 7
#define FULL 1
#define MAX_KEYS 256
#define SLOTS 512 /* the key table: open addressing, at most half full */

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

/* zlib's crc32(data, crc): slicing by 8. */
static uint32_t crc32_update(uint32_t crc, const unsigned char *p, Py_ssize_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint32_t a = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = crc_table[7][a & 0xFF] ^ crc_table[6][(a >> 8) & 0xFF] ^ crc_table[5][(a >> 16) & 0xFF] ^
              crc_table[4][a >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

typedef struct {
    double value;
    int32_t row;
    int32_t key; /* key index << 1 | is_int */
} item_t;

typedef struct {
    const unsigned char *key[SLOTS];
    Py_ssize_t len[SLOTS];
    int id[SLOTS];
    const unsigned char *by_id_key[MAX_KEYS];
    Py_ssize_t by_id_len[MAX_KEYS];
    int count;
    item_t *items;
    Py_ssize_t n_items, cap_items;
} scan_t;

/* The index of `key` in the table, added if new; -1 when the table is full. */
static int key_id(scan_t *s, const unsigned char *key, Py_ssize_t len) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (Py_ssize_t i = 0; i < len; i++) h = (h ^ key[i]) * 16777619u;
    for (uint32_t slot = h % SLOTS;; slot = (slot + 1) % SLOTS) {
        if (s->key[slot] == NULL) {
            if (s->count == MAX_KEYS) return -1;
            s->key[slot] = key;
            s->len[slot] = len;
            s->by_id_key[s->count] = key;
            s->by_id_len[s->count] = len;
            s->id[slot] = s->count;
            return s->count++;
        }
        if (s->len[slot] == len && memcmp(s->key[slot], key, (size_t)len) == 0) return s->id[slot];
    }
}

/* A varint at p[*i] (before end): 0 and the value, or -1 (past the end, or longer than 10 bytes). */
static int varint(const unsigned char *p, Py_ssize_t *i, Py_ssize_t end, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift <= 63; shift += 7) {
        if (*i >= end) return -1;
        unsigned char b = p[(*i)++];
        v |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* The field at p[*i] as protobuf reads it: its tag, and for wire type 2 its bytes (*start, *len); -1 for
 * anything the Python reader would refuse or read otherwise (the record goes to it). */
static int field(const unsigned char *p, Py_ssize_t *i, Py_ssize_t end, uint64_t *tag, Py_ssize_t *start,
                 Py_ssize_t *len) {
    if (varint(p, i, end, tag) < 0 || *tag < 8 || *tag >= ((uint64_t)1 << 32)) return -1;
    uint64_t v;
    switch (*tag & 7) {
    case 0:
        return varint(p, i, end, &v);
    case 1:
    case 5: {
        Py_ssize_t width = (*tag & 7) == 1 ? 8 : 4;
        if (end - *i < width) return -1;
        *i += width;
        return 0;
    }
    case 2:
        if (varint(p, i, end, &v) < 0 || v > (uint64_t)(end - *i)) return -1;
        *start = *i;
        *len = (Py_ssize_t)v;
        *i += (Py_ssize_t)v;
        return 0;
    default:
        return -1;
    }
}

static const double exact_tens[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

#define NOT_A_NUMBER 0
#define NUMBER 1
#define INTEGER 2
#define UNSURE -1

/* What Python's _number(value) makes of a history value's JSON text: NOT_A_NUMBER (None), NUMBER (a float,
 * in *out), INTEGER (an int, exact in *out), or UNSURE (the Python reader decides). */
static int classify(const unsigned char *v, Py_ssize_t n, double *out) {
    if (n == 0) return NOT_A_NUMBER;
    unsigned char c = v[0];
    if (!(c == '-' || (c >= '0' && c <= '9') || c == 'N' || c == 'I')) return NOT_A_NUMBER;
    if (n == 3 && memcmp(v, "NaN", 3) == 0) {
        *out = Py_NAN;
        return NUMBER;
    }
    if (n == 8 && memcmp(v, "Infinity", 8) == 0) {
        *out = Py_HUGE_VAL;
        return NUMBER;
    }
    if (n == 9 && memcmp(v, "-Infinity", 9) == 0) {
        *out = -Py_HUGE_VAL;
        return NUMBER;
    }
    Py_ssize_t i = 0;
    while (i < n && v[i] >= '0' && v[i] <= '9') i++;
    if (i == n) { /* digits only: int(value) */
        if (n > 15) return UNSURE;
        int64_t x = 0;
        for (i = 0; i < n; i++) x = x * 10 + (v[i] - '0');
        *out = (double)x;
        return INTEGER;
    }
    /* a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
    int negative = v[0] == '-';
    i = negative;
    uint64_t mantissa = 0;
    int digits = 0, exponent = 0; /* significant digits taken, and the power of ten they are off by */
    int lost = 0;                 /* significant digits beyond 19 */
    Py_ssize_t first = i;
    while (i < n && v[i] >= '0' && v[i] <= '9') {
        if (mantissa || v[i] != '0') {
            if (digits < 19) {
                mantissa = mantissa * 10 + (uint64_t)(v[i] - '0');
                digits++;
            } else {
                lost = 1;
                exponent++;
            }
        }
        i++;
    }
    if (i == first || (v[first] == '0' && i - first > 1)) return UNSURE;
    if (i < n && v[i] == '.') {
        Py_ssize_t f = ++i;
        while (i < n && v[i] >= '0' && v[i] <= '9') {
            if (mantissa || v[i] != '0') {
                if (digits < 19) {
                    mantissa = mantissa * 10 + (uint64_t)(v[i] - '0');
                    digits++;
                    exponent--;
                } else {
                    lost = 1;
                }
            } else {
                exponent--;
            }
            i++;
        }
        if (i == f) return UNSURE;
    }
    if (i < n && (v[i] == 'e' || v[i] == 'E')) {
        i++;
        int sign = 1;
        if (i < n && (v[i] == '+' || v[i] == '-')) sign = v[i++] == '-' ? -1 : 1;
        Py_ssize_t e = i;
        int value = 0;
        while (i < n && v[i] >= '0' && v[i] <= '9') {
            if (value < 100000) value = value * 10 + (v[i] - '0');
            i++;
        }
        if (i == e) return UNSURE;
        exponent += sign * value;
    }
    if (i != n) return UNSURE;
    if (!lost && digits <= 15 && exponent >= -22 && exponent <= 22) {
        double m = (double)mantissa; /* exact: below 10^15 < 2^53 */
        double x = exponent >= 0 ? m * exact_tens[exponent] : m / exact_tens[-exponent];
        *out = negative ? -x : x;
        return NUMBER;
    }
    char text[128];
    if (n >= (Py_ssize_t)sizeof text) return UNSURE;
    memcpy(text, v, (size_t)n);
    text[n] = 0;
    char *end = NULL;
    double x = PyOS_string_to_double(text, &end, NULL); /* float()'s parser; +-inf when out of range */
    if (x == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return UNSURE;
    }
    if (end != text + n) return UNSURE;
    *out = x;
    return NUMBER;
}

static int add_item(scan_t *s, double value, int32_t row, int key, int is_int) {
    if (s->n_items == s->cap_items) {
        Py_ssize_t cap = s->cap_items ? 2 * s->cap_items : 1024;
        item_t *grown = PyMem_Realloc(s->items, (size_t)cap * sizeof(item_t));
        if (grown == NULL) return -1;
        s->items = grown;
        s->cap_items = cap;
    }
    s->items[s->n_items++] = (item_t){value, row, key << 1 | is_int};
    return 0;
}

#define READ 1
#define NOT_HISTORY 0
#define TO_PYTHON -1
#define NO_MEMORY -2

/* One record's data: READ (its row added as `row`), NOT_HISTORY, TO_PYTHON, or NO_MEMORY. */
static int read_record(scan_t *s, const unsigned char *p, Py_ssize_t n, int32_t row) {
    Py_ssize_t i = 0, h = -1, hn = 0;
    while (i < n) { /* Record: fields up to the first length-delimited field 2 */
        uint64_t tag;
        Py_ssize_t start = 0, len = 0;
        if (field(p, &i, n, &tag, &start, &len) < 0) return TO_PYTHON;
        if (tag >> 3 == 2 && (tag & 7) != 0) { /* (Python takes a fixed-width field 2 as bytes too) */
            if ((tag & 7) != 2) return TO_PYTHON;
            h = start;
            hn = len;
            break;
        }
    }
    if (h < 0) return NOT_HISTORY;
    const unsigned char *q = p + h;
    Py_ssize_t mark = s->n_items;
    i = 0;
    while (i < hn) {
        Py_ssize_t size, end;
        if (q[i] == 0x0A && i + 1 < hn && (size = q[i + 1]) < 0x80 && (end = i + 2 + size) <= hn) {
            Py_ssize_t k = size >= 5 ? q[i + 3] : 0x80;
            if (k < 0x80 && q[i + 2] == 0x0A && 5 + k <= size && q[i + 4 + k] == 0x82 && q[i + 5 + k] == 0x01 &&
                q[i + 6 + k] == size - 5 - k) {
                double x = 0.0;
                int kind = classify(q + i + 7 + k, end - (i + 7 + k), &x);
                if (kind == UNSURE) goto to_python;
                if (kind != NOT_A_NUMBER) {
                    int id = key_id(s, q + i + 4, k);
                    if (id < 0) goto to_python;
                    if (add_item(s, x, row, id, kind == INTEGER) < 0) return NO_MEMORY;
                }
                i = end;
                continue;
            }
        }
        uint64_t tag;
        Py_ssize_t start = 0, len = 0;
        if (field(q, &i, hn, &tag, &start, &len) < 0) goto to_python;
        if ((tag >> 3 != 1 && tag >> 3 != 2) || (tag & 7) == 0) continue; /* neither an item nor the step */
        if ((tag & 7) != 2 || tag >> 3 == 1 || len == 0 || q[start] != 0x08) goto to_python; /* another layout */
        Py_ssize_t j = start + 1;
        uint64_t num;
        if (varint(q, &j, start + len, &num) < 0 || num > ((uint64_t)1 << 53)) goto to_python;
        int id = key_id(s, (const unsigned char *)"_step", 5);
        if (id < 0) goto to_python;
        if (add_item(s, (double)num, row, id, 1) < 0) return NO_MEMORY;
    }
    return READ;
to_python:
    s->n_items = mark; /* the row's items so far are dropped: Python reads the whole record */
    return TO_PYTHON;
}

static PyObject *wandb_block(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t at;
    if (!PyArg_ParseTuple(args, "y*n", &view, &at)) return NULL;
    const unsigned char *b = view.buf;
    Py_ssize_t n = view.len;
    scan_t *s = PyMem_Calloc(1, sizeof(scan_t));
    if (s == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    int32_t rows = 0;
    int failed = 0;
    while (at >= 0 && BLOCK - at >= HEADER && at + HEADER <= n) {
        const unsigned char *r = b + at;
        uint32_t crc = (uint32_t)r[0] | (uint32_t)r[1] << 8 | (uint32_t)r[2] << 16 | (uint32_t)r[3] << 24;
        Py_ssize_t len = (Py_ssize_t)r[4] | (Py_ssize_t)r[5] << 8;
        unsigned char kind = r[6];
        if (kind == 0 && len == 0 && crc == 0) {
            at = -1; /* zeros: the rest of the block is unused */
            break;
        }
        if (kind != FULL || at + HEADER + len > n) break;
        unsigned char type_byte = FULL;
        if (crc32_update(crc32_update(0, &type_byte, 1), r + HEADER, len) != crc) break;
        int got = read_record(s, r + HEADER, len, rows);
        if (got == NO_MEMORY) {
            failed = 1;
            break;
        }
        if (got == TO_PYTHON) break;
        rows += got == READ;
        at += HEADER + len;
    }
    PyObject *result = NULL, *keys = NULL, *items = NULL;
    if (failed) {
        PyErr_NoMemory();
    } else if ((keys = PyList_New(s->count)) != NULL) {
        for (int k = 0; k < s->count; k++) {
            PyObject *key = PyBytes_FromStringAndSize((const char *)s->by_id_key[k], s->by_id_len[k]);
            if (key == NULL) {
                Py_CLEAR(keys);
                break;
            }
            PyList_SET_ITEM(keys, k, key);
        }
        if (keys != NULL &&
            (items = PyBytes_FromStringAndSize((const char *)s->items, s->n_items * (Py_ssize_t)sizeof(item_t))))
            result = Py_BuildValue("(niOO)", at, rows, keys, items);
    }
    Py_XDECREF(keys);
    Py_XDECREF(items);
    PyMem_Free(s->items);
    PyMem_Free(s);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *crc32(PyObject *self, PyObject *args) {
    Py_buffer view;
    unsigned int crc = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &view, &crc)) return NULL;
    uint32_t out = crc32_update(crc, view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(out);
}

static PyObject *number(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    double x = 0.0;
    int kind = classify(view.buf, view.len, &x);
    PyBuffer_Release(&view);
    return Py_BuildValue("(id)", kind, x);
}

static PyMethodDef methods[] = {
    {"wandb_block", wandb_block, METH_VARARGS,
     "wandb_block(block, at) -> (stop, rows, keys, items): the history rows of the whole W&B records from\n"
     "byte at of one 32 KiB block, up to the first record it leaves to the Python reader (see _logscan.c)."},
    {"crc32", crc32, METH_VARARGS, "crc32(data[, crc]) -> zlib.crc32(data, crc), as wandb_block computes it (tests)."},
    {"number", number, METH_O,
     "number(value_json) -> (kind, value): how wandb_block classifies a history value: 0 not a number, 1 a\n"
     "float, 2 an int (exact), -1 left to Python (tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gradtool.io._logscan",
                                    "Optional compiled W&B history reader (see _logscan.c).", -1, methods};

PyMODINIT_FUNC PyInit__logscan(void) {
    crc_init();
    return PyModule_Create(&module);
}
