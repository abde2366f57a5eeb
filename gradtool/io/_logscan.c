/* gradtool.io._logscan: the optional compiled readers of training logs (loaded by gradtool/io/compiled.py):
 * W&B run-log history rows (wandb_block, wandb_record: gradtool/io/wandb_log.py), TensorBoard event files'
 * TFRecord framing, CRCs and add_scalar events (tfrecord_frames, tfevent_scalars: tensorboard_log.py),
 * MLflow metric lines (mlflow_metric_lines: mlflow_store.py) and text log lines by a line template
 * (template_text: text_logs.py). Each stops at, or leaves to the Python reader, whatever it does not read
 * exactly as that reader does; each Python reader is the fallback when the extension is not built.
 *
 * wandb_block(block, at, row, out) -> (stop, rows) reads, from byte `at` of one 32 KiB block of a W&B run
 * log (a LevelDB-style log: records [crc32 u32][length u16][type u8][data]), the whole (FULL) records that
 * follow one another there, as the Python reader does: each record's CRC-32 (zlib's, seeded with the type
 * byte) checked; a protobuf Record whose first length-delimited field 2 (Record.history) is a
 * HistoryRecord gives a row of its numeric items, any other record none. wandb_record(data, row, out) ->
 * 1 (a row), 0 (not a history record) or -1 (left to Python) reads one whole record so (one the Python
 * reader joined from its parts). They read only what wandb writes:
 *   items laid out as  0a L 0a K <key> 82 01 V <value_json>  (every length one byte), the layout the Python
 *   reader's fast path reads (history_rows), with values that are JSON numbers, NaN, Infinity or
 *   -Infinity (numbers) or that do not start like a number (left out: images, tables, strings);
 *   the step  12 L 08 <varint>  (HistoryStep.num), given as the item "_step".
 * wandb_block stops, returning `stop`, before the first record it does not read so: a record of another
 * type (the parts of a record split over blocks), a CRC that does not match, a record running past the
 * block, a record or item of another layout, a value it cannot classify exactly (a number with an
 * underscore, an integer of more than 15 digits), more than MAX_KEYS distinct keys in one record. The Python
 * reader reads that record and calls again after it; `stop` is -1 when the rest of the block is zeros
 * (unused), and the block's end when it read everything. So the rows are exactly the Python reader's:
 * stricter here is only slower, never different (tests/suggest/test_wandb_compiled.py property-tests the
 * two on generated and damaged logs).
 *
 * out = (keys, values, rows, ids, skip[, table]): the rows' items are appended, in logging order, to the
 * bytearrays values (float64), rows (int32: `row` and on, one per history row) and ids (int32: key << 1 |
 * is_int, is_int when the value's JSON was all digits, as Python's int() reads it); keys is a dict of every
 * item key (bytes) to its index, new keys added in first-seen order; the values of keys in the set skip are
 * not parsed (NaN: a column nobody reads, as wandb's own _runtime and _timestamp), only classified; table, a
 * key_table(), keeps the keys met from one call to the next (without it, each call starts empty). Values:
 * integers exactly; other numbers correctly rounded, as Python's float() reads them: with one IEEE operation
 * when they have at most 15 significant digits and a power of ten at most 10^22 (Clinger's fast path),
 * else by the Eisel-Lemire algorithm (at most 19 digits; its table of powers of ten in _logscan_pow10.h),
 * else (more digits, subnormals, a case it cannot decide) with Python's own parser, PyOS_string_to_double.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__))
#include <emmintrin.h>
#endif

#define BLOCK 32768
#define HEADER 7
#define FULL 1
#define SLOTS 512 /* the key table: open addressing, at most half full; grown (doubled) up to MAX_SLOTS */
#define MAX_SLOTS (1 << 17)
#define MAX_KEYS (MAX_SLOTS / 2) /* a log of each parameter's norm: a key per parameter (4,096 left a mixture
                                  * of experts' 5,000 to Python: 500 records, 5.5 -> 0.9 s) */

#include "../_crc32.h" /* zlib's CRC-32: crc_init, crc_update, crc32_with (carry-less), crc32_combine */

static crc_tables_t crc32c_tables; /* CRC-32C (Castagnoli): TFRecord's */

static uint32_t crc32_update(uint32_t crc, const unsigned char *p, Py_ssize_t n) {
    return crc32_with(crc, p, n, CRC_SIMD_BEST);
}

/* TFRecord's masked CRC-32C of p[0:n]: the CRC rotated right by 15 bits plus 0xA282EAD8. */
static uint32_t masked_crc32c(const unsigned char *p, Py_ssize_t n) {
    uint32_t crc = crc_update((const uint32_t(*)[256])crc32c_tables, 0, p, n);
    return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

static uint64_t u64_le(const unsigned char *p) {
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--) v = v << 8 | p[k];
    return v;
}

static uint32_t u32_le(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* tfrecord_frames(buffer) -> (starts, lengths, end, bad_length, data_ok): the whole TFRecord records of a
 * buffer that starts at a record ([length u64][masked CRC-32C of the length u32][data][masked CRC-32C of
 * the data u32]), as tensorboard_log._framing frames them: starts (int64: where each record's data
 * starts) and lengths (int64) as bytes, `end` where the records end (a record cut off there, by the end
 * of the buffer, is left out). Framing stops before the first record whose length field does not match
 * its CRC (a damaged length would misplace every record after it): `bad_length` is where that record
 * starts, or -1. data_ok: one byte per record, whether its data matches its CRC (the caller decides
 * which records must). GIL released. */
static PyObject *tfrecord_frames(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *b = view.buf;
    Py_ssize_t n = view.len, cap = n / 16 + 1, count = 0, pos = 0, bad = -1;
    int64_t *starts = PyMem_RawMalloc((size_t)cap * sizeof(int64_t));
    int64_t *lengths = PyMem_RawMalloc((size_t)cap * sizeof(int64_t));
    unsigned char *ok = PyMem_RawMalloc((size_t)cap);
    PyObject *result = NULL;
    if (starts == NULL || lengths == NULL || ok == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    while (pos + 12 <= n) {
        uint64_t length = u64_le(b + pos);
        if (n - pos < 16 || length > (uint64_t)(n - pos - 16)) break; /* cut off by the end of the buffer */
        if (masked_crc32c(b + pos, 8) != u32_le(b + pos + 8)) {
            bad = pos;
            break;
        }
        Py_ssize_t at = pos + 12, len = (Py_ssize_t)length;
        starts[count] = at;
        lengths[count] = len;
        ok[count++] = masked_crc32c(b + at, len) == u32_le(b + at + len);
        pos = at + len + 4;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(y#y#nny#)", (const char *)starts, count * (Py_ssize_t)sizeof(int64_t),
                           (const char *)lengths, count * (Py_ssize_t)sizeof(int64_t), pos, bad,
                           (const char *)ok, count);
done:
    PyMem_RawFree(starts);
    PyMem_RawFree(lengths);
    PyMem_RawFree(ok);
    PyBuffer_Release(&view);
    return result;
}

/* Where the float32 of a Summary.Value's scalar starts in the rest of the value after its tag, v (n bytes),
 * and its kind << 8 (see tfevent_scalars), or -1 when v is not one of the layouts named there. */
static int64_t tensor_scalar_at(const unsigned char *v, int64_t n) {
    if (n == 5 && v[0] == 0x15) return 1; /* simple_value */
    if (n < 8 || v[0] != 0x42) return -1;
    int64_t t = v[1];
    if (t >= 0x80 || t + 2 > n || v[2] != 0x08 || v[3] != 0x01) return -1;
    int64_t q = 4;
    if (t == 10) {
        if (v[4] != 0x12 || v[5] != 0x00) return -1; /* an empty tensor_shape: the shape () */
        q = 6;
    } else if (t != 8) {
        return -1;
    }
    if ((v[q] != 0x22 && v[q] != 0x2A) || v[q + 1] != 0x04) return -1;
    int64_t rest = n - 2 - t;
    static const unsigned char meta[] = {0x4A, 0x0B, 0x0A, 0x09, 0x0A, 0x07,
                                         's', 'c', 'a', 'l', 'a', 'r', 's'};
    if (rest == 0) return 1 << 8 | (q + 2);
    if ((rest == 13 && memcmp(v + 2 + t, meta, 13) == 0) ||
        (rest == 15 && v[2 + t] == 0x4A && v[3 + t] == 0x0D && memcmp(v + 4 + t, meta + 2, 11) == 0 &&
         v[15 + t] == 0x20 && v[16 + t] == 0x01))
        return 2 << 8 | (q + 2);
    return -1;
}

#define MAX_TAGS 65536 /* (1,024 left a log of each of 2,000 parameters' norms half to Python: 5.9 -> 1.2 s) */
#define TAG_SLOTS (2 * MAX_TAGS)

/* tfevent_scalars(buffer, starts, lengths) -> (found, steps, values, tags, names, kinds): of the records
 * whose data are at starts (int64) with lengths (int64) in the buffer, those laid out as writers write one
 * scalar's event, as tensorboard_log._scalar_records finds them:
 *   09 <wall_time: 8 bytes> 10 <step: a varint of 1-4 bytes> 2a L 0a V 0a K <tag: K bytes> <value>
 * where <value> is SummaryWriter.add_scalar's simple_value, 15 <float32> (kind 0), or a tensor of one float32
 * as TensorFlow 2's tf.summary.scalar (tensor_content), add_scalar(new_style=True) and TensorBoard's
 * make_tensor_proto (float_val) write it, 42 T 08 01 [12 00] (22|2a) 04 <float32>, without metadata (kind 1)
 * or with the scalars plugin's, 4a M 0a 09 0a 07 "scalars" [20 01] (kind 2); each length a byte < 128, each
 * field ending the message it is in. found: a byte per record; steps (int64), values (float64, the float32
 * widened), tags (int32, into names: each tag's bytes, in first-seen order) and kinds (uint8) of the found
 * ones, in order. Records of more than MAX_TAGS tags are left (not found): the caller reads them one by one.
 * GIL released for the scan. */
static PyObject *tfevent_scalars(PyObject *self, PyObject *args) {
    Py_buffer view, sv, lv;
    if (!PyArg_ParseTuple(args, "y*y*y*", &view, &sv, &lv)) return NULL;
    const unsigned char *b = view.buf;
    const int64_t *starts = sv.buf, *lengths = lv.buf;
    Py_ssize_t n = sv.len / (Py_ssize_t)sizeof(int64_t), count = 0;
    unsigned char *found = PyMem_RawCalloc((size_t)n + 1, 1);
    int64_t *steps = PyMem_RawMalloc(((size_t)n + 1) * sizeof(int64_t));
    double *values = PyMem_RawMalloc(((size_t)n + 1) * sizeof(double));
    int32_t *tags = PyMem_RawMalloc(((size_t)n + 1) * sizeof(int32_t));
    unsigned char *kinds = PyMem_RawMalloc((size_t)n + 1);
    int32_t *slot_tag = PyMem_RawMalloc(TAG_SLOTS * sizeof(int32_t));
    const unsigned char **tag_at = PyMem_RawMalloc(MAX_TAGS * sizeof(*tag_at));
    Py_ssize_t *tag_len = PyMem_RawMalloc(MAX_TAGS * sizeof(Py_ssize_t));
    int n_tags = 0;
    PyObject *result = NULL, *names = NULL;
    if (found == NULL || steps == NULL || values == NULL || tags == NULL || kinds == NULL ||
        slot_tag == NULL || tag_at == NULL || tag_len == NULL || lv.len != sv.len) {
        if (lv.len != sv.len) PyErr_SetString(PyExc_ValueError, "starts and lengths differ in size");
        else PyErr_NoMemory();
        goto done;
    }
    for (int k = 0; k < TAG_SLOTS; k++) slot_tag[k] = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < n; r++) {
        int64_t at = starts[r], size = lengths[r];
        if (at < 0 || size < 22 || at > view.len || size > view.len - at) continue;
        const unsigned char *d = b + at;
        if (d[0] != 0x09 || d[9] != 0x10) continue;
        int width = 0;
        uint64_t step = 0;
        for (int k = 0; k < 4; k++) {
            step |= (uint64_t)(d[10 + k] & 0x7F) << (7 * k);
            if (d[10 + k] < 0x80) {
                width = k + 1;
                break;
            }
        }
        if (!width) continue;
        int64_t p = 10 + width;
        if (p + 6 > size || d[p] != 0x2A) continue;
        int64_t outer = d[p + 1], value = d[p + 3], k = d[p + 5];
        if (outer >= 0x80 || p + 2 + outer != size || d[p + 2] != 0x0A || value != outer - 2 ||
            d[p + 4] != 0x0A || k > value - 4)
            continue;
        int64_t x_at = tensor_scalar_at(d + p + 6 + k, value - 2 - k);
        if (x_at < 0) continue;
        unsigned char kind = (unsigned char)(x_at >> 8);
        x_at = p + 6 + k + (x_at & 0xFF);
        const unsigned char *tag = d + p + 6;
        uint32_t h = 2166136261u; /* FNV-1a */
        for (int64_t i = 0; i < k; i++) h = (h ^ tag[i]) * 16777619u;
        int id = -1;
        for (uint32_t slot = h % TAG_SLOTS;; slot = (slot + 1) % TAG_SLOTS) {
            int t = slot_tag[slot];
            if (t < 0) {
                if (n_tags == MAX_TAGS) break;
                tag_at[n_tags] = tag;
                tag_len[n_tags] = (Py_ssize_t)k;
                id = slot_tag[slot] = n_tags++;
                break;
            }
            if (tag_len[t] == k && memcmp(tag_at[t], tag, (size_t)k) == 0) {
                id = t;
                break;
            }
        }
        if (id < 0) continue;
        uint32_t bits = u32_le(d + x_at); /* protobuf's fixed32 and tensor_content: little-endian */
        float x;
        memcpy(&x, &bits, 4);
        found[r] = 1;
        steps[count] = (int64_t)step;
        values[count] = (double)x;
        kinds[count] = kind;
        tags[count++] = id;
    }
    Py_END_ALLOW_THREADS
    names = PyList_New(n_tags);
    for (int t = 0; names != NULL && t < n_tags; t++) {
        PyObject *name = PyBytes_FromStringAndSize((const char *)tag_at[t], tag_len[t]);
        if (name == NULL) Py_CLEAR(names);
        else PyList_SET_ITEM(names, t, name);
    }
    if (names != NULL)
        result = Py_BuildValue("(y#y#y#y#Oy#)", (const char *)found, n, (const char *)steps,
                               count * (Py_ssize_t)sizeof(int64_t), (const char *)values,
                               count * (Py_ssize_t)sizeof(double), (const char *)tags,
                               count * (Py_ssize_t)sizeof(int32_t), names, (const char *)kinds, count);
done:
    Py_XDECREF(names);
    PyMem_RawFree(found);
    PyMem_RawFree(steps);
    PyMem_RawFree(values);
    PyMem_RawFree(tags);
    PyMem_RawFree(kinds);
    PyMem_RawFree(slot_tag);
    PyMem_RawFree(tag_at);
    PyMem_RawFree(tag_len);
    PyBuffer_Release(&view);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&lv);
    return result;
}

typedef struct {
    unsigned char *key; /* a copy of the key's bytes (the table's own); NULL: an empty slot */
    Py_ssize_t len;
    uint32_t hash; /* key_hash(key, len) */
    int id;        /* the key's index in the dict of keys; -1 until an item of it is read */
    int skip;      /* its values are not needed */
} slot_t;

typedef struct {
    slot_t *table; /* `slots` slots: `first` until it is outgrown, then on the heap */
    uint32_t slots;
    int count;
    int *pending, n_pending; /* slots of keys new to the dict in the record being read (at most slots / 2) */
    slot_t first[SLOTS];
    int first_pending[SLOTS / 2];
    int max_keys; /* keys the table holds at most (MAX_KEYS; fewer in tests) */
    int full;     /* a key was refused: the table held max_keys keys */
    PyObject *keys, *skip_set; /* the call's dict of keys and skip set (borrowed) */
    PyObject *bound_keys, *bound_skip; /* a kept table's: the dict and set its ids and skips are of (owned) */
    double *values;
    int32_t *rows, *ids;
    Py_ssize_t n_items, cap_items;
} scan_t;

/* A hash of a key, eight bytes a step (a byte a step, FNV-1a, was most of the time of a record of 5,000
 * keys of ~40 bytes): each word xored in, multiplied, its high half folded down. */
static uint32_t key_hash(const unsigned char *key, Py_ssize_t len) {
    uint64_t h = 0x9E3779B97F4A7C15u ^ (uint64_t)len, w;
    Py_ssize_t i = 0;
    for (; i + 8 <= len; i += 8) {
        memcpy(&w, key + i, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDu;
        h ^= h >> 32;
    }
    w = 0;
    memcpy(&w, key + i, (size_t)(len - i));
    h = (h ^ w) * 0xC4CEB9FE1A85EC53u;
    return (uint32_t)(h ^ h >> 29);
}

/* The key table twice as large, its keys (and the slots in `pending`) moved: 0, or -1 out of memory. */
static int grow_keys(scan_t *s) {
    uint32_t slots = 2 * s->slots;
    slot_t *table = PyMem_Calloc(slots, sizeof(slot_t));
    int *pending = PyMem_Malloc(slots / 2 * sizeof(int));
    int32_t *moved = PyMem_Malloc(s->slots * sizeof(int32_t));
    if (table == NULL || pending == NULL || moved == NULL) {
        PyMem_Free(table);
        PyMem_Free(pending);
        PyMem_Free(moved);
        return -1;
    }
    for (uint32_t old = 0; old < s->slots; old++) {
        moved[old] = -1;
        if (s->table[old].key == NULL) continue;
        uint32_t slot = s->table[old].hash & (slots - 1);
        while (table[slot].key != NULL) slot = (slot + 1) & (slots - 1);
        table[slot] = s->table[old];
        moved[old] = (int32_t)slot;
    }
    for (int k = 0; k < s->n_pending; k++) pending[k] = moved[s->pending[k]];
    PyMem_Free(moved);
    if (s->table != s->first) {
        PyMem_Free(s->table);
        PyMem_Free(s->pending);
    }
    s->table = table;
    s->pending = pending;
    s->slots = slots;
    return 0;
}

/* A new scan (keys table empty), or NULL out of memory. */
static scan_t *scan_new(void) {
    scan_t *s = PyMem_Calloc(1, sizeof(scan_t));
    if (s == NULL) return NULL;
    s->table = s->first;
    s->pending = s->first_pending;
    s->slots = SLOTS;
    s->max_keys = MAX_KEYS;
    return s;
}

/* The key table emptied (its size kept): no record is being read (nothing pending). */
static void clear_keys(scan_t *s) {
    for (uint32_t k = 0; k < s->slots; k++) PyMem_Free(s->table[k].key);
    memset(s->table, 0, s->slots * sizeof(slot_t));
    s->count = 0;
}

/* The items read so far freed (flush has copied them out). */
static void free_items(scan_t *s) {
    PyMem_Free(s->values);
    PyMem_Free(s->rows);
    PyMem_Free(s->ids);
    s->values = NULL;
    s->rows = s->ids = NULL;
    s->n_items = s->cap_items = 0;
}

static void scan_free(scan_t *s) {
    if (s == NULL) return;
    clear_keys(s);
    if (s->table != s->first) {
        PyMem_Free(s->table);
        PyMem_Free(s->pending);
    }
    free_items(s);
    Py_XDECREF(s->bound_keys);
    Py_XDECREF(s->bound_skip);
    PyMem_Free(s);
}

#define NO_MEMORY -2
#define FAILED -3 /* a Python error is set */

/* The slot of `key` in the table (added, with whether its values are skipped, when new; the table grown
 * when half full); -1 when it holds MAX_KEYS keys, FAILED on a Python error (or out of memory). */
static int key_slot(scan_t *s, const unsigned char *key, Py_ssize_t len) {
    uint32_t h = key_hash(key, len);
    for (uint32_t slot = h & (s->slots - 1);; slot = (slot + 1) & (s->slots - 1)) {
        slot_t *e = &s->table[slot];
        if (e->key == NULL) {
            if (s->count >= s->max_keys) {
                s->full = 1;
                return -1;
            }
            if ((uint32_t)s->count == s->slots / 2) {
                if (grow_keys(s) < 0) {
                    PyErr_NoMemory();
                    return FAILED;
                }
                return key_slot(s, key, len);
            }
            PyObject *name = PyBytes_FromStringAndSize((const char *)key, len);
            if (name == NULL) return FAILED;
            int skip = PySet_Contains(s->skip_set, name);
            Py_DECREF(name);
            if (skip < 0) return FAILED;
            unsigned char *copy = PyMem_Malloc(len ? (size_t)len : 1);
            if (copy == NULL) {
                PyErr_NoMemory();
                return FAILED;
            }
            if (len) memcpy(copy, key, (size_t)len);
            e->key = copy;
            e->len = len;
            e->hash = h;
            e->id = -1;
            e->skip = skip;
            s->count++;
            return (int)slot;
        }
        if (e->hash == h && e->len == len && memcmp(e->key, key, (size_t)len) == 0) return (int)slot;
    }
}

/* The index of the slot's key in the dict of keys: looked up when first needed; a key new to the dict is
 * given the next index and added when its record is read whole (commit), forgotten if it is left to
 * Python (rollback): the dict gets the keys of the items read, in first-seen order. FAILED on an error. */
static int slot_id(scan_t *s, int slot) {
    slot_t *e = &s->table[slot];
    if (e->id >= 0) return e->id;
    PyObject *name = PyBytes_FromStringAndSize((const char *)e->key, e->len);
    if (name == NULL) return FAILED;
    PyObject *known = PyDict_GetItemWithError(s->keys, name);
    Py_DECREF(name);
    long id;
    if (known != NULL) {
        id = PyLong_AsLong(known);
    } else if (PyErr_Occurred()) {
        return FAILED;
    } else {
        id = (long)PyDict_Size(s->keys) + s->n_pending;
        s->pending[s->n_pending++] = slot;
    }
    if (id < 0 || id >= (1L << 30)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_OverflowError, "key index out of range");
        return FAILED;
    }
    return e->id = (int)id;
}

static int commit(scan_t *s) {
    for (int k = 0; k < s->n_pending; k++) {
        slot_t *e = &s->table[s->pending[k]];
        PyObject *name = PyBytes_FromStringAndSize((const char *)e->key, e->len);
        PyObject *index = name == NULL ? NULL : PyLong_FromLong(e->id);
        int failed = index == NULL || PyDict_SetItem(s->keys, name, index) < 0;
        Py_XDECREF(name);
        Py_XDECREF(index);
        if (failed) return FAILED;
    }
    s->n_pending = 0;
    return 0;
}

static void rollback(scan_t *s) {
    for (int k = 0; k < s->n_pending; k++) s->table[s->pending[k]].id = -1;
    s->n_pending = 0;
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

#ifdef __SIZEOF_INT128__
#include "_logscan_pow10.h"

/* mantissa * 10^exp10 correctly rounded to the nearest double (ties to even), by the Eisel-Lemire
 * algorithm (D. Lemire, "Number Parsing at a Gigabyte per Second", 2021; as Go's strconv.eiselLemire64
 * writes it): 0 and the double in *out, or -1 where it cannot decide or the result is subnormal, infinite
 * or out of the table's range (the caller then uses CPython's own parser). mantissa: the exact decimal
 * digits (at most 19), not 0. */
static int eisel_lemire(uint64_t mantissa, int exp10, int negative, double *out) {
    if (exp10 < POW10_MIN || exp10 > POW10_MAX) return -1;
    int clz = __builtin_clzll(mantissa);
    uint64_t man = mantissa << clz;
    uint64_t exp2 = (uint64_t)(((217706 * exp10) >> 16) + 64 + 1023) - (uint64_t)clz;
    const uint64_t *pow = pow10_128[exp10 - POW10_MIN];
    unsigned __int128 x = (unsigned __int128)man * pow[1];
    uint64_t hi = (uint64_t)(x >> 64), lo = (uint64_t)x;
    if ((hi & 0x1FF) == 0x1FF && lo + man < man) { /* a wider approximation */
        unsigned __int128 y = (unsigned __int128)man * pow[0];
        uint64_t y_hi = (uint64_t)(y >> 64), y_lo = (uint64_t)y;
        uint64_t merged_hi = hi, merged_lo = lo + y_hi;
        if (merged_lo < lo) merged_hi++;
        if ((merged_hi & 0x1FF) == 0x1FF && merged_lo + 1 == 0 && y_lo + man < man) return -1;
        hi = merged_hi;
        lo = merged_lo;
    }
    uint64_t msb = hi >> 63;
    uint64_t bits = hi >> (msb + 9);
    exp2 -= 1 ^ msb;
    if (lo == 0 && (hi & 0x1FF) == 0 && (bits & 3) == 1) return -1; /* halfway: undecided */
    bits += bits & 1;
    bits >>= 1;
    if (bits >> 53) {
        bits >>= 1;
        exp2 += 1;
    }
    if (exp2 - 1 >= 0x7FF - 1) return -1; /* subnormal, or beyond the largest double */
    bits = exp2 << 52 | (bits & 0x000FFFFFFFFFFFFFull) | (negative ? 0x8000000000000000ull : 0);
    memcpy(out, &bits, 8);
    return 0;
}
#endif

static const double exact_tens[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

#define NOT_A_NUMBER 0
#define NUMBER 1
#define INTEGER 2
#define UNSURE -1

static int decimal(const unsigned char *v, Py_ssize_t n, int json, double *out, int need_value);

/* What Python's _number(value) makes of a history value's JSON text: NOT_A_NUMBER (None), NUMBER (a float,
 * in *out), INTEGER (an int, exact in *out), or UNSURE (the Python reader decides). */
static int classify(const unsigned char *v, Py_ssize_t n, double *out, int need_value) {
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
    return decimal(v, n, 1, out, need_value);
}

/* The decimal number v[0:n] as float() reads it: NUMBER (its double in *out; NaN when !need_value) or
 * UNSURE (not such a number, or one to leave to Python). json: a JSON number,
 * -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?; else as a text log writes numbers,
 * [-+]?[0-9]+\.?[0-9]*([eE][-+]?[0-9]+)? (leading zeros, "1."). */
static int decimal(const unsigned char *v, Py_ssize_t n, int json, double *out, int need_value) {
    int negative = n > 0 && v[0] == '-';
    Py_ssize_t i = negative || (!json && n > 0 && v[0] == '+');
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
    if (i == first || (json && v[first] == '0' && i - first > 1)) return UNSURE;
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
        if (json && i == f) return UNSURE;
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
    if (!need_value) {
        *out = Py_NAN;
        return NUMBER;
    }
    if (!lost && digits <= 15 && exponent >= -22 && exponent <= 22) {
        double m = (double)mantissa; /* exact: below 10^15 < 2^53 */
        double x = exponent >= 0 ? m * exact_tens[exponent] : m / exact_tens[-exponent];
        *out = negative ? -x : x;
        return NUMBER;
    }
#ifdef __SIZEOF_INT128__
    if (!lost && mantissa && eisel_lemire(mantissa, exponent, negative, out) == 0) return NUMBER;
#endif
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
        Py_ssize_t cap = s->cap_items ? 2 * s->cap_items : 4096;
        double *values = PyMem_Realloc(s->values, (size_t)cap * sizeof(double));
        if (values != NULL) s->values = values;
        int32_t *rows = values == NULL ? NULL : PyMem_Realloc(s->rows, (size_t)cap * sizeof(int32_t));
        if (rows != NULL) s->rows = rows;
        int32_t *ids = rows == NULL ? NULL : PyMem_Realloc(s->ids, (size_t)cap * sizeof(int32_t));
        if (ids == NULL) return NO_MEMORY;
        s->ids = ids;
        s->cap_items = cap;
    }
    s->values[s->n_items] = value;
    s->rows[s->n_items] = row;
    s->ids[s->n_items++] = key << 1 | is_int;
    return 0;
}

#define READ 1
#define NOT_HISTORY 0
#define TO_PYTHON -1

/* One record's data: READ (its row added as `row`), NOT_HISTORY, TO_PYTHON, NO_MEMORY or FAILED. */
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
            if (k < 0x80 && q[i + 2] == 0x0A && 5 + k <= size && q[i + 4 + k] == 0x82 &&
                q[i + 5 + k] == 0x01 && q[i + 6 + k] == size - 5 - k) {
                int slot = key_slot(s, q + i + 4, k);
                if (slot == FAILED) goto failed;
                if (slot < 0) goto to_python;
                double x = 0.0;
                int kind = classify(q + i + 7 + k, end - (i + 7 + k), &x, !s->table[slot].skip);
                if (kind == UNSURE) goto to_python;
                if (kind != NOT_A_NUMBER) {
                    int id = slot_id(s, slot);
                    if (id == FAILED) goto failed;
                    if (add_item(s, x, row, id, kind == INTEGER) < 0) goto no_memory;
                }
                i = end;
                continue;
            }
        }
        uint64_t tag;
        Py_ssize_t start = 0, len = 0;
        if (field(q, &i, hn, &tag, &start, &len) < 0) goto to_python;
        if ((tag >> 3 != 1 && tag >> 3 != 2) || (tag & 7) == 0) continue; /* neither an item nor the step */
        if ((tag & 7) != 2 || tag >> 3 == 1 || len == 0 || q[start] != 0x08)
            goto to_python; /* another layout */
        Py_ssize_t j = start + 1;
        uint64_t num;
        if (varint(q, &j, start + len, &num) < 0 || num > ((uint64_t)1 << 53)) goto to_python;
        int slot = key_slot(s, (const unsigned char *)"_step", 5);
        if (slot == FAILED) goto failed;
        if (slot < 0) goto to_python;
        int id = slot_id(s, slot);
        if (id == FAILED) goto failed;
        if (add_item(s, (double)num, row, id, 1) < 0) goto no_memory;
    }
    return commit(s) == 0 ? READ : FAILED;
to_python:
    s->n_items = mark; /* the row's items so far are dropped: Python reads the whole record */
    rollback(s);
    return TO_PYTHON;
no_memory:
    rollback(s);
    return NO_MEMORY;
failed:
    rollback(s);
    return FAILED;
}

#define OUT_TYPES "out must be (keys dict, values, rows, ids bytearrays, skip set[, key_table()])"
#define KEY_TABLE "gradtool.io._logscan.key_table"

static void key_table_free(PyObject *capsule) {
    scan_free(PyCapsule_GetPointer(capsule, KEY_TABLE));
}

/* key_table([max_keys]) -> a key table kept from one call of wandb_block or wandb_record to the next (the
 * sixth item of `out`): the keys met, whether their values are skipped and, once their records are read,
 * their indices in the dict of keys, so a log of 5,000 keys a record looks each up once, not once a record
 * (5,000 keys: ~2.8 -> ~0.9 ms a record). It belongs to the dict and set it was first called with: called
 * with others, it is emptied first. It holds at most max_keys keys (MAX_KEYS; fewer in tests): a record that
 * finds it full is read again from an empty table, and left to Python if that is not enough. */
static PyObject *key_table(PyObject *self, PyObject *args) {
    int max_keys = MAX_KEYS;
    if (!PyArg_ParseTuple(args, "|i", &max_keys)) return NULL;
    if (max_keys < 1 || max_keys > MAX_KEYS) {
        PyErr_Format(PyExc_ValueError, "max_keys must be in [1, %d]", MAX_KEYS);
        return NULL;
    }
    scan_t *s = scan_new();
    if (s == NULL) return PyErr_NoMemory();
    s->max_keys = max_keys;
    PyObject *capsule = PyCapsule_New(s, KEY_TABLE, key_table_free);
    if (capsule == NULL) scan_free(s);
    return capsule;
}

/* Parse `out` = (keys dict, values, rows, ids bytearrays, skip set[, key table]) into *scan: the key
 * table's scan (emptied if it was of another dict or set), else a new one (*temporary = 1, to be freed);
 * -1 with an error set. */
static int take_out(PyObject *out, scan_t **scan, int *temporary, PyObject **arrays) {
    Py_ssize_t size = PyTuple_Check(out) ? PyTuple_GET_SIZE(out) : 0;
    if ((size != 5 && size != 6) || !PyDict_Check(PyTuple_GET_ITEM(out, 0)) ||
        !PyAnySet_Check(PyTuple_GET_ITEM(out, 4)) ||
        (size == 6 && !PyCapsule_IsValid(PyTuple_GET_ITEM(out, 5), KEY_TABLE))) {
        PyErr_SetString(PyExc_TypeError, OUT_TYPES);
        return -1;
    }
    for (int k = 1; k < 4; k++) {
        arrays[k - 1] = PyTuple_GET_ITEM(out, k);
        if (!PyByteArray_Check(arrays[k - 1])) {
            PyErr_SetString(PyExc_TypeError, OUT_TYPES);
            return -1;
        }
    }
    PyObject *keys = PyTuple_GET_ITEM(out, 0), *skip = PyTuple_GET_ITEM(out, 4);
    scan_t *s;
    if (size == 6) {
        s = PyCapsule_GetPointer(PyTuple_GET_ITEM(out, 5), KEY_TABLE);
        if (s->bound_keys != keys || s->bound_skip != skip) {
            clear_keys(s);
            Py_INCREF(keys);
            Py_INCREF(skip);
            Py_XSETREF(s->bound_keys, keys);
            Py_XSETREF(s->bound_skip, skip);
        }
        *temporary = 0;
    } else {
        s = scan_new();
        if (s == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        *temporary = 1;
    }
    s->keys = keys;
    s->skip_set = skip;
    *scan = s;
    return 0;
}

/* Append the items read to the bytearrays and free them (and the scan, if `temporary`). -1 with an error
 * set. */
static int flush(scan_t *s, int temporary, PyObject **arrays) {
    const void *src[3] = {s->values, s->rows, s->ids};
    const Py_ssize_t width[3] = {sizeof(double), sizeof(int32_t), sizeof(int32_t)};
    int failed = 0;
    for (int k = 0; k < 3 && s->n_items && !failed; k++) {
        Py_ssize_t had = PyByteArray_GET_SIZE(arrays[k]);
        if (PyByteArray_Resize(arrays[k], had + s->n_items * width[k]) < 0)
            failed = 1;
        else
            memcpy(PyByteArray_AS_STRING(arrays[k]) + had, src[k], (size_t)(s->n_items * width[k]));
    }
    free_items(s);
    if (temporary) scan_free(s);
    return failed ? -1 : 0;
}

/* read_record, and again from an empty key table when the table, holding keys of earlier records, was
 * full (a log whose keys change over time: each record is read as it would be from a new table). */
static int read_record_again_if_full(scan_t *s, const unsigned char *p, Py_ssize_t n, int32_t row) {
    int had = s->count;
    s->full = 0;
    int got = read_record(s, p, n, row);
    if (got == TO_PYTHON && s->full && had > 0) {
        clear_keys(s);
        s->full = 0;
        got = read_record(s, p, n, row);
    }
    return got;
}

static PyObject *wandb_block(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t at;
    int row0;
    PyObject *out, *arrays[3];
    if (!PyArg_ParseTuple(args, "y*niO", &view, &at, &row0, &out)) return NULL;
    scan_t *s;
    int temporary;
    if (take_out(out, &s, &temporary, arrays) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const unsigned char *b = view.buf;
    Py_ssize_t n = view.len;
    int32_t rows = 0;
    int got = 0;
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
        got = read_record_again_if_full(s, r + HEADER, len, row0 + rows);
        if (got < NOT_HISTORY) break;
        rows += got == READ;
        at += HEADER + len;
    }
    if (got == NO_MEMORY) PyErr_NoMemory();
    int failed = got <= NO_MEMORY;
    failed |= flush(s, temporary, arrays) < 0;
    PyBuffer_Release(&view);
    return failed ? NULL : Py_BuildValue("(ni)", at, rows);
}

static PyObject *wandb_record(PyObject *self, PyObject *args) {
    Py_buffer view;
    int row0;
    PyObject *out, *arrays[3];
    if (!PyArg_ParseTuple(args, "y*iO", &view, &row0, &out)) return NULL;
    scan_t *s;
    int temporary;
    if (take_out(out, &s, &temporary, arrays) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int got = read_record_again_if_full(s, view.buf, view.len, row0);
    if (got == NO_MEMORY) PyErr_NoMemory();
    int failed = got <= NO_MEMORY;
    failed |= flush(s, temporary, arrays) < 0;
    PyBuffer_Release(&view);
    return failed ? NULL : PyLong_FromLong(got);
}

/* An int64 at v[*i] as Python's int() reads an MLflow field: -?[0-9]{1,18}; -1 for anything else. */
static int metric_int(const unsigned char *v, Py_ssize_t *i, Py_ssize_t end, int64_t *out) {
    int negative = *i < end && v[*i] == '-';
    Py_ssize_t first = *i + negative, k = first;
    int64_t x = 0;
    while (k < end && v[k] >= '0' && v[k] <= '9' && k - first < 18) x = x * 10 + (v[k++] - '0');
    if (k == first || (k < end && v[k] >= '0' && v[k] <= '9')) return -1;
    *out = negative ? -x : x;
    *i = k;
    return 0;
}

/* mlflow_metric_lines(buffer) -> (steps, timestamps, values) as int64, int64, float64 bytes, or None: an
 * MLflow file-store metric file of lines "<timestamp> <value> <step>\n" (the last line's break optional),
 * each field as Python's int() and float() read it: integers of at most 18 digits, values that are JSON
 * numbers (correctly rounded, as classify reads them) or nan, inf, -inf (str() of the nonfinite floats).
 * None for anything else (two fields, blank lines, other spellings): the caller's parser decides there.
 * GIL held: the float parser's slow path is CPython's. */
static PyObject *mlflow_metric_lines(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *b = view.buf;
    Py_ssize_t n = view.len, lines = 0, cap = 0;
    for (Py_ssize_t i = 0; i < n; i++) cap += b[i] == '\n';
    cap += 1;
    int64_t *steps = PyMem_RawMalloc((size_t)cap * sizeof(int64_t));
    int64_t *stamps = PyMem_RawMalloc((size_t)cap * sizeof(int64_t));
    double *values = PyMem_RawMalloc((size_t)cap * sizeof(double));
    PyObject *result = NULL;
    int ok = steps != NULL && stamps != NULL && values != NULL;
    if (!ok) PyErr_NoMemory();
    Py_ssize_t i = 0;
    while (ok && i < n) {
        Py_ssize_t end = i;
        while (end < n && b[end] != '\n') end++;
        Py_ssize_t k = i;
        int64_t stamp, step;
        ok = metric_int(b, &k, end, &stamp) == 0 && k < end && b[k] == ' ';
        if (ok) {
            Py_ssize_t v = ++k;
            while (k < end && b[k] != ' ') k++;
            Py_ssize_t len = k - v;
            double x = 0.0;
            if (len == 3 && memcmp(b + v, "nan", 3) == 0) x = Py_NAN;
            else if (len == 3 && memcmp(b + v, "inf", 3) == 0) x = Py_HUGE_VAL;
            else if (len == 4 && memcmp(b + v, "-inf", 4) == 0) x = -Py_HUGE_VAL;
            else ok = classify(b + v, len, &x, 1) > 0;
            values[lines] = x;
        }
        ok = ok && k < end && b[k] == ' ';
        if (ok) {
            k++;
            ok = metric_int(b, &k, end, &step) == 0 && k == end;
        }
        if (ok) {
            stamps[lines] = stamp;
            steps[lines++] = step;
        }
        i = end + 1;
    }
    if (ok)
        result = Py_BuildValue("(y#y#y#)", (const char *)steps, lines * (Py_ssize_t)sizeof(int64_t),
                               (const char *)stamps, lines * (Py_ssize_t)sizeof(int64_t),
                               (const char *)values,
                               lines * (Py_ssize_t)sizeof(double));
    else if (!PyErr_Occurred())
        result = Py_NewRef(Py_None);
    PyMem_RawFree(steps);
    PyMem_RawFree(stamps);
    PyMem_RawFree(values);
    PyBuffer_Release(&view);
    return result;
}

/* A text log line template's operations (text_logs._LineTemplate.ops): */
#define OP_TEXT 0   /* (0, bytes): that text */
#define OP_SPACES 1 /* (1,): one or more spaces */
#define OP_SLOT 2   /* (2, captured, signed, words, step[, commas]): a number, as the template's pattern
                     * reads it (commas: a template of numbers with thousands commas, _UNSIGNED's) */
/* and a dict-line template's (dict_lines._DictTemplate.ops): its texts, and */
#define OP_VALUE 3  /* (3,): a value, the longest run of [0-9A-Za-z_.+-] there */
/* and a text log template's again: */
#define OP_BAR 4    /* (4,): a progress bar's cells, the longest run (maybe none) of " #1-9" and the block
                     * elements U+2580-U+259F (in UTF-8, e2 96 80-9f) there: text_logs._BAR_CELLS */

typedef struct {
    int kind, captured, is_signed, words, step, commas;
    const char *text;
    Py_ssize_t len;
} op_t;

/* A template's ops (a tuple of tuples) as op_t, of the kinds `allowed` (a bit each), one zeroed op_t after
 * them; the ops that capture a number (captured slots, values) counted in *captured, which must lie in
 * [least, most] and be the number of bytearrays in the list out. NULL with ValueError "<who>: malformed ops
 * or out" (or the error raised). */
static op_t *read_ops(PyObject *ops_obj, PyObject *out, unsigned allowed, int least, int most, const char *who,
                      int *captured) {
    Py_ssize_t n_ops = PyTuple_GET_SIZE(ops_obj);
    op_t *ops = PyMem_Calloc((size_t)n_ops + 1, sizeof(op_t));
    if (ops == NULL) return (op_t *)PyErr_NoMemory();
    int count = 0;
    for (Py_ssize_t k = 0; k < n_ops; k++) {
        PyObject *t = PyTuple_GET_ITEM(ops_obj, k);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 1) goto bad_ops;
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
        if (kind < 0 || kind > OP_BAR || !(allowed >> kind & 1u)) goto bad_ops;
        ops[k].kind = (int)kind;
        if (kind == OP_TEXT) {
            if (PyTuple_GET_SIZE(t) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(t, 1))) goto bad_ops;
            ops[k].text = PyBytes_AS_STRING(PyTuple_GET_ITEM(t, 1));
            ops[k].len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, 1));
        } else if (kind == OP_SLOT) {
            if (PyTuple_GET_SIZE(t) != 5 && PyTuple_GET_SIZE(t) != 6) goto bad_ops;
            ops[k].captured = PyObject_IsTrue(PyTuple_GET_ITEM(t, 1));
            ops[k].is_signed = PyObject_IsTrue(PyTuple_GET_ITEM(t, 2));
            ops[k].words = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 3));
            ops[k].step = PyObject_IsTrue(PyTuple_GET_ITEM(t, 4));
            ops[k].commas = PyTuple_GET_SIZE(t) == 6 && PyObject_IsTrue(PyTuple_GET_ITEM(t, 5));
            count += ops[k].captured;
        } else if (kind == OP_VALUE) {
            count++;
        }
    }
    if (PyErr_Occurred()) goto failed;
    if (count < least || count > most || PyList_GET_SIZE(out) != count) goto bad_ops;
    for (Py_ssize_t j = 0; j < count; j++)
        if (!PyByteArray_Check(PyList_GET_ITEM(out, j))) goto bad_ops;
    *captured = count;
    return ops;
bad_ops:
    PyErr_Format(PyExc_ValueError, "%s: malformed ops or out", who);
failed:
    PyMem_Free(ops);
    return NULL;
}

/* Match line[0:n] against ops; 1 and the captured values in row (int64 for a step, the bits of a float64
 * else) on a match, 0 when it does not match here (the pattern decides). A slot: step, ASCII digits (at
 * most 18); else an optional sign where the template's line had one, ASCII digits, an optional ".", digits,
 * an optional exponent (taken only whole), read as float() reads it; or, where the number does not start
 * (words 1: the loss's, 2: the norm's), "nan", "inf" (2: "infinity" too). */
static int match_ops(const op_t *ops, Py_ssize_t n_ops, const unsigned char *s, Py_ssize_t n, int64_t *row) {
    Py_ssize_t pos = 0;
    int n_row = 0;
    for (Py_ssize_t k = 0; k < n_ops; k++) {
        const op_t *op = &ops[k];
        if (op->kind == OP_TEXT) {
            if (n - pos < op->len || memcmp(s + pos, op->text, (size_t)op->len) != 0) return 0;
            pos += op->len;
        } else if (op->kind == OP_SPACES) {
            if (pos >= n || s[pos] != ' ') return 0;
            while (pos < n && s[pos] == ' ') pos++;
        } else if (op->kind == OP_BAR) {
            for (;;) {
                if (pos < n && (s[pos] == ' ' || s[pos] == '#' || (s[pos] >= '1' && s[pos] <= '9')))
                    pos++;
                else if (n - pos >= 3 && s[pos] == 0xe2 && s[pos + 1] == 0x96 && s[pos + 2] >= 0x80 &&
                         s[pos + 2] <= 0x9f)
                    pos += 3;
                else
                    break;
            }
        } else {
            Py_ssize_t q = pos;
            int sign_ok = !op->is_signed || (q < n && (s[q] == '-' || s[q] == '+'));
            q += op->is_signed && sign_ok;
            Py_ssize_t d = q;
            while (sign_ok && q < n && s[q] >= '0' && s[q] <= '9') q++;
            double x = 0.0;
            int64_t step = 0;
            Py_ssize_t grouped = q; /* with commas, _UNSIGNED's first form: \d{1,3}(,\d{3})+(?=\s|$) */
            while (op->commas && !op->step && q > d && q - d <= 3 && n - grouped >= 4 && s[grouped] == ',' &&
                   s[grouped + 1] - '0' < 10u && s[grouped + 2] - '0' < 10u && s[grouped + 3] - '0' < 10u)
                grouped += 4;
            if (grouped > q && !(grouped == n || s[grouped] == ' ' || s[grouped] == '\t' || s[grouped] == 0x1f))
                grouped = q; /* (no space or end after the last group: the second form) */
            if (q > d && op->step) {
                if (q - d > 18) return 0;
                for (Py_ssize_t i = d; i < q; i++) step = step * 10 + (s[i] - '0');
            } else if (grouped > q) { /* an integer: its digits without the commas (float() of them) */
                int64_t whole = 0;
                int digits = 0;
                for (Py_ssize_t i = d; i < grouped && op->captured && digits <= 15; i++)
                    if (s[i] != ',') whole = whole * 10 + (s[i] - '0'), digits++;
                if (digits > 15) return 0; /* (a value of more digits: the Python reader's) */
                x = (double)whole;
                if (op->is_signed && s[pos] == '-') x = -x;
                q = grouped;
            } else if (q > d) {
                if (q < n && s[q] == '.') q++;
                while (q < n && s[q] >= '0' && s[q] <= '9') q++;
                if (q < n && (s[q] == 'e' || s[q] == 'E')) {
                    Py_ssize_t e = q + 1;
                    if (e < n && (s[e] == '+' || s[e] == '-')) e++;
                    if (e < n && s[e] >= '0' && s[e] <= '9') {
                        while (e < n && s[e] >= '0' && s[e] <= '9') e++;
                        q = e;
                    }
                }
                if (op->captured && decimal(s + pos, q - pos, 0, &x, 1) != NUMBER) return 0;
            } else if (op->words && n - pos >= 3 && memcmp(s + pos, "nan", 3) == 0) {
                q = pos + 3;
                x = Py_NAN;
            } else if (op->words && n - pos >= 3 && memcmp(s + pos, "inf", 3) == 0) {
                q = pos + 3;
                if (op->words == 2 && n - q >= 5 && memcmp(s + q, "inity", 5) == 0) q += 5;
                x = Py_HUGE_VAL;
            } else {
                return 0;
            }
            if (op->captured) {
                if (!op->step) memcpy(&step, &x, sizeof step);
                row[n_row++] = step;
            }
            pos = q;
        }
    }
    return pos == n;
}

static int holds_norm(const unsigned char *s, Py_ssize_t n) {
    const unsigned char *p = s, *end = s + n;
    while (end - p >= 4 && (p = memchr(p, 'n', (size_t)(end - p - 3))) != NULL) {
        if (p[1] == 'o' && p[2] == 'r' && p[3] == 'm') return 1;
        p++;
    }
    return 0;
}

/* Whether c is a line break str.splitlines() knows but "\n": \r (\r\n one break), \v, \f, \x1c-\x1e,
 * U+0085, U+2028, U+2029 (branch free). */
#define OTHER_BREAK(c)                                                                                         \
    (((c) == '\r') | ((c) == 0x0b) | ((c) == 0x0c) | ((Py_UCS4)(c) - 0x1c < 3u) | ((Py_UCS4)(c) == 0x85) |   \
     ((Py_UCS4)(c) == 0x2028) | ((Py_UCS4)(c) == 0x2029))

/* The offset of the first OTHER_BREAK of t[i:n] (with `newline`, of a "\n" too; n: none). With SSE2, 16
 * bytes at a time: a control character but "\t" (and "\n"), U+0085, U+2028, U+2029 found by compares, each
 * then tested exactly (a compare of a character at a time, even in blocks the compiler vectorised, ran at
 * ~2 ns a character, most of newline_lines' time). */
#if defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__))
#define SSE2_BREAKS 1
#endif
#define IS_BREAK(c, newline) (((newline) && (c) == '\n') || OTHER_BREAK(c))

static Py_ssize_t next_break_1(const Py_UCS1 *t, Py_ssize_t i, Py_ssize_t n, int newline) {
#ifdef SSE2_BREAKS
    const __m128i high = _mm_set1_epi8((char)0xe0), tab = _mm_set1_epi8('\t'), nel = _mm_set1_epi8((char)0x85),
                  nl = newline ? tab : _mm_set1_epi8('\n'), zero = _mm_setzero_si128();
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(t + i));
        __m128i ctl = _mm_andnot_si128(_mm_or_si128(_mm_cmpeq_epi8(v, nl), _mm_cmpeq_epi8(v, tab)),
                                       _mm_cmpeq_epi8(_mm_and_si128(v, high), zero));
        unsigned m = (unsigned)_mm_movemask_epi8(_mm_or_si128(ctl, _mm_cmpeq_epi8(v, nel)));
        for (; m; m &= m - 1)
            if (IS_BREAK(t[i + __builtin_ctz(m)], newline)) return i + __builtin_ctz(m);
    }
#endif
    while (i < n && !IS_BREAK(t[i], newline)) i++;
    return i;
}

static Py_ssize_t next_break_2(const Py_UCS2 *t, Py_ssize_t i, Py_ssize_t n, int newline) {
#ifdef SSE2_BREAKS
    const __m128i tab = _mm_set1_epi16('\t'), nl = newline ? tab : _mm_set1_epi16('\n'),
                  nel = _mm_set1_epi16(0x85), ls = _mm_set1_epi16(0x2028), ps = _mm_set1_epi16(0x2029),
                  zero = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(t + i));
        __m128i ctl = _mm_andnot_si128(_mm_or_si128(_mm_cmpeq_epi16(v, nl), _mm_cmpeq_epi16(v, tab)),
                                       _mm_cmpeq_epi16(_mm_srli_epi16(v, 5), zero));
        __m128i odd = _mm_or_si128(_mm_cmpeq_epi16(v, nel), _mm_or_si128(_mm_cmpeq_epi16(v, ls),
                                                                          _mm_cmpeq_epi16(v, ps)));
        unsigned m = (unsigned)_mm_movemask_epi8(_mm_or_si128(ctl, odd)) & 0x5555u; /* a bit a character */
        for (; m; m &= m - 1)
            if (IS_BREAK(t[i + __builtin_ctz(m) / 2], newline)) return i + __builtin_ctz(m) / 2;
    }
#endif
    while (i < n && !IS_BREAK(t[i], newline)) i++;
    return i;
}

static Py_ssize_t next_break_4(const Py_UCS4 *t, Py_ssize_t i, Py_ssize_t n, int newline) {
    while (i < n && !IS_BREAK(t[i], newline)) i++;
    return i;
}

/* Eight characters at s, if all ASCII, lowercased to eight bytes at to: 1; else 0 (nothing written). */
static int ascii8_lowered(const Py_UCS2 *s, unsigned char *to) {
#ifdef SSE2_BREAKS
    __m128i v = _mm_loadu_si128((const __m128i *)s);
    if (_mm_movemask_epi8(_mm_cmpeq_epi16(_mm_srli_epi16(v, 7), _mm_setzero_si128())) != 0xffff) return 0;
    __m128i b = _mm_packus_epi16(v, v); /* (every one < 0x80: packed as it is) */
    __m128i upper = _mm_and_si128(_mm_cmpgt_epi8(b, _mm_set1_epi8('A' - 1)), _mm_cmplt_epi8(b, _mm_set1_epi8('Z' + 1)));
    _mm_storel_epi64((__m128i *)to, _mm_or_si128(b, _mm_and_si128(upper, _mm_set1_epi8(0x20))));
    return 1;
#else
    (void)s, (void)to;
    return 0;
#endif
}

/* c lowercased as str.lower() lowers it (its simple mapping, Py_UNICODE_TOLOWER), in UTF-8 at to (room
 * for 4 bytes): the number of bytes; -1 for U+0130 (two characters) and U+03A3 (lowered by its place in a
 * word), the only ones Unicode's SpecialCasing lowers so but by language; or (a Python without that macro)
 * for any character that is not ASCII. */
static int utf8_lowered(Py_UCS4 c, unsigned char *to) {
    if (c < 0x80) {
        to[0] = (unsigned char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        return 1;
    }
#ifdef Py_UNICODE_TOLOWER
    if (c == 0x130 || c == 0x3a3) return -1;
    c = Py_UNICODE_TOLOWER(c);
    if (c < 0x80) { /* (the Kelvin sign's k) */
        to[0] = (unsigned char)c;
        return 1;
    }
    if (c < 0x800) {
        to[0] = (unsigned char)(0xc0 | c >> 6), to[1] = (unsigned char)(0x80 | (c & 0x3f));
        return 2;
    }
    if (c < 0x10000) {
        to[0] = (unsigned char)(0xe0 | c >> 12), to[1] = (unsigned char)(0x80 | (c >> 6 & 0x3f));
        to[2] = (unsigned char)(0x80 | (c & 0x3f));
        return 3;
    }
    to[0] = (unsigned char)(0xf0 | c >> 18), to[1] = (unsigned char)(0x80 | (c >> 12 & 0x3f));
    to[2] = (unsigned char)(0x80 | (c >> 6 & 0x3f)), to[3] = (unsigned char)(0x80 | (c & 0x3f));
    return 4;
#else
    return -1;
#endif
}

/* lowered_line's general case, for a text of characters of type T: the line's end found first (any break
 * str.splitlines() knows), *buf grown to 4 bytes a character of it, then each character lowered, ASCII in
 * line (eight at a time in a text of two-byte characters, with SSE2) and the others by utf8_lowered, whose
 * last result is kept (a tqdm bar's few blocks). It was a PyUnicode_READ, a break test and a capacity test a
 * character: template_text over 8x10^5 tqdm lines with the bar's blocks 0.78-1.01 -> 0.45 s. */
#define LOWERED_LINE(T, next_break)                                                                            \
    do {                                                                                                       \
        const T *s = (const T *)data;                                                                          \
        Py_ssize_t e = next_break(s, pos, n, 1);                                                               \
        if (4 * (e - pos) + 4 > *cap) {                                                                        \
            Py_ssize_t want = 4 * (e - pos) + 256;                                                             \
            unsigned char *grown = PyMem_Realloc(*buf, (size_t)want);                                          \
            if (grown == NULL) return -2;                                                                      \
            *buf = grown, *cap = want;                                                                         \
        }                                                                                                      \
        unsigned char *to = *buf, last_utf8[4];                                                                \
        Py_UCS4 last = 0; /* (no character: 0 is ASCII) */                                                     \
        Py_ssize_t o = 0;                                                                                      \
        int last_len = 0;                                                                                      \
        for (Py_ssize_t i = pos; i < e; i++) {                                                                 \
            while (sizeof(T) == 2 && e - i >= 8 && ascii8_lowered((const Py_UCS2 *)data + i, to + o))          \
                i += 8, o += 8;                                                                                \
            if (i == e) break;                                                                                 \
            Py_UCS4 c = s[i];                                                                                  \
            if (c < 0x80) {                                                                                    \
                to[o++] = (unsigned char)(c | (Py_UCS4)(c - 'A' < 26u) << 5);                                  \
                continue;                                                                                      \
            }                                                                                                  \
            if (c != last) {                                                                                   \
                if ((last_len = utf8_lowered(c, last_utf8)) < 0) return -1;                                    \
                last = c;                                                                                      \
            }                                                                                                  \
            memcpy(to + o, last_utf8, (size_t)last_len);                                                       \
            o += last_len;                                                                                     \
        }                                                                                                      \
        *next = e >= n ? n : e + 1 + (s[e] == '\r' && e + 1 < n && s[e + 1] == '\n');                         \
        return o;                                                                                              \
    } while (0)

/* The line of text (kind, data, length n) that starts at pos, lowercased as str.lower() lowercases it, in
 * UTF-8 into *buf (grown as needed, *cap bytes): its length in bytes, with *next the offset after its line
 * break (as str.splitlines() splits); -1 when it holds a character utf8_lowered leaves to Python; -2 when
 * out of memory. (A tqdm bar's blocks: its lines were left to the template's pattern, 10^6 in ~2 s.) */
static Py_ssize_t lowered_line(int kind, const void *data, Py_ssize_t n, Py_ssize_t pos, unsigned char **buf,
                               Py_ssize_t *cap, Py_ssize_t *next) {
    if (kind == PyUnicode_1BYTE_KIND) { /* one pass the compiler vectorises; the rare odd line again */
        const unsigned char *s = (const unsigned char *)data, *nl = memchr(s + pos, '\n', (size_t)(n - pos));
        Py_ssize_t end = nl == NULL ? n : nl - s;
        if (end - pos > *cap) {
            Py_ssize_t want = 2 * (end - pos) + 256;
            unsigned char *grown = PyMem_Realloc(*buf, (size_t)want);
            if (grown == NULL) return -2;
            *buf = grown, *cap = want;
        }
        unsigned char *out = *buf, odd = 0;
        s += pos;
        for (Py_ssize_t i = 0; i < end - pos; i++) {
            unsigned char c = s[i];
            odd |= (c >= 0x80) | (c < 0x20 && c != '\t');
            out[i] = c | (unsigned char)(((unsigned char)(c - 'A') < 26) << 5);
        }
        if (!odd) {
            *next = end < n ? end + 1 : n;
            return end - pos;
        }
        LOWERED_LINE(Py_UCS1, next_break_1);
    }
    if (kind == PyUnicode_2BYTE_KIND) LOWERED_LINE(Py_UCS2, next_break_2);
    LOWERED_LINE(Py_UCS4, next_break_4);
}

/* newline_lines's passes for characters of type T: count the breaks (and "\r\n" pairs) or, with out,
 * copy the text between them to out, a "\n" for each. */
#define BREAK_PASSES(T, next_break)                                                                            \
    do {                                                                                                       \
        const T *t = (const T *)data;                                                                          \
        for (Py_ssize_t i = 0, j; (j = next_break(t, i, n, 0)) < n; i = j + 1) {                               \
            Py_UCS4 c = t[j];                                                                                  \
            if (c == 0x85 || c == 0x2028 || c == 0x2029) Py_RETURN_NONE;                                       \
            breaks++;                                                                                          \
            pairs += c == '\r' && j + 1 < n && t[j + 1] == '\n';                                               \
        }                                                                                                      \
        if (breaks == 0) return Py_NewRef(text);                                                               \
        out = PyUnicode_New(n - pairs, PyUnicode_MAX_CHAR_VALUE(text));                                        \
        if (out == NULL) return NULL;                                                                          \
        T *o = (T *)PyUnicode_DATA(out);                                                                       \
        Py_ssize_t i = 0;                                                                                      \
        for (Py_ssize_t j; (j = next_break(t, i, n, 0)) < n; i = j + 1) {                                      \
            memcpy(o, t + i, (size_t)(j - i) * sizeof(T));                                                     \
            o += j - i;                                                                                        \
            *o++ = '\n';                                                                                       \
            j += t[j] == '\r' && j + 1 < n && t[j + 1] == '\n';                                                \
        }                                                                                                      \
        memcpy(o, t + i, (size_t)(n - i) * sizeof(T));                                                         \
    } while (0)

/* newline_lines(text) -> str | None: text_logs._newline_lines, in two passes over the text instead of a
 * search per kind of break (eight over a text that is not ASCII) and a copy per kind it holds: every line
 * break str.splitlines() knows made "\n" ("\r\n" one break); the text itself when it holds none but "\n";
 * None (the Python function's work) when it holds U+0085, U+2028 or U+2029, whose "\n" may make a str of
 * a narrower kind. */
static PyObject *newline_lines(PyObject *self, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "newline_lines: a str is needed");
        return NULL;
    }
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), breaks = 0, pairs = 0;
    PyObject *out = NULL;
    if (kind == PyUnicode_1BYTE_KIND)
        BREAK_PASSES(Py_UCS1, next_break_1);
    else if (kind == PyUnicode_2BYTE_KIND)
        BREAK_PASSES(Py_UCS2, next_break_2);
    else
        BREAK_PASSES(Py_UCS4, next_break_4);
    return out;
}

/* Append rows[0:n_rows] (n_cols int64 or float64 bits each) to the bytearrays of list out, by column. */
static int append_columns(PyObject *out, const int64_t *rows, Py_ssize_t n_rows, int n_cols) {
    for (int j = 0; j < n_cols; j++) {
        PyObject *col = PyList_GET_ITEM(out, j);
        Py_ssize_t had = PyByteArray_GET_SIZE(col);
        if (PyByteArray_Resize(col, had + n_rows * 8) < 0) return -1;
        int64_t *to = (int64_t *)(void *)(PyByteArray_AS_STRING(col) + had);
        for (Py_ssize_t r = 0; r < n_rows; r++) memcpy(&to[r], &rows[r * n_cols + j], 8);
    }
    return 0;
}

/* template_text(ops, text, pos, out[, strict]) -> (stop, resume, rows): the lines of str text from offset
 * pos on (the start of a line; lines as text.splitlines() gives them, lowercased), those holding "norm" that
 * the template's ops match read, the others skipped, up to `stop`: the offset of the first line holding
 * "norm" that they do not match here (strict: of the first line they do not match), or of the first line
 * lowered_line leaves to Python (or len(text)). The numbers captured are appended to
 * out, a list of one bytearray per captured slot, in the line's order: int64 for the step, float64 else;
 * `rows` lines were read, `resume` is the offset after the last line read (pos: none). The caller reads the
 * lines from `resume` on itself (the lines skipped may start a block), and the line at `stop` by the
 * pattern. */
static PyObject *template_text(PyObject *self, PyObject *args) {
    PyObject *ops_obj, *text, *out;
    Py_ssize_t pos;
    int strict = 0;
    if (!PyArg_ParseTuple(args, "O!UnO!|p", &PyTuple_Type, &ops_obj, &text, &pos, &PyList_Type, &out,
                          &strict))
        return NULL;
    Py_ssize_t n_ops = PyTuple_GET_SIZE(ops_obj), n = PyUnicode_GET_LENGTH(text);
    int captured;
    op_t *ops = read_ops(ops_obj, out, 1u << OP_TEXT | 1u << OP_SPACES | 1u << OP_SLOT | 1u << OP_BAR, 0, 64,
                         "template_text", &captured);
    if (ops == NULL) return NULL;
    unsigned char *line = NULL;
    int64_t *rows = NULL;
    Py_ssize_t cap = 0, n_rows = 0, rows_cap = 0;
    if (pos < 0 || pos > n) {
        PyErr_SetString(PyExc_IndexError, "template_text: pos out of range");
        goto failed;
    }
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t at = pos, resume = pos, next;
    while (at < n) {
        Py_ssize_t len = lowered_line(kind, data, n, at, &line, &cap, &next);
        if (len == -2) {
            PyErr_NoMemory();
            goto failed;
        }
        if (len < 0) break;
        if (n_rows == rows_cap) {
            rows_cap = 2 * rows_cap + 1024;
            int64_t *grown = PyMem_Realloc(rows, (size_t)rows_cap * (size_t)(captured ? captured : 1) * 8);
            if (grown == NULL) {
                PyErr_NoMemory();
                goto failed;
            }
            rows = grown;
        }
        if (match_ops(ops, n_ops, line, len, rows + n_rows * captured)) {
            n_rows++;
            resume = next;
        } else if (strict || holds_norm(line, len)) {
            break;
        }
        at = next;
    }
    if (append_columns(out, rows, n_rows, captured) < 0) goto failed;
    PyMem_Free(ops);
    PyMem_Free(line);
    PyMem_Free(rows);
    return Py_BuildValue("(nnn)", at, resume, n_rows);
failed:
    PyMem_Free(ops);
    PyMem_Free(line);
    PyMem_Free(rows);
    return NULL;
}


/* Whether c may be in a dict-line template's value (dict_lines._VALUE): [0-9A-Za-z_.+-]. */
static int value_char(Py_UCS4 c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '.' ||
           c == '+' || c == '-';
}

/* The value token v[0:n] as dict_lines reads it (_num(token): float(), NaN positive): 1 and *out for a
 * decimal number float() reads (decimal(), as a text log writes numbers) or Python's repr of a NaN or an
 * infinity ("nan", "inf", "-inf"); 0 for any other token (the Python reader reads its line). */
static int dict_value(const unsigned char *v, Py_ssize_t n, double *out) {
    if (n == 3 && memcmp(v, "nan", 3) == 0) {
        *out = Py_NAN;
        return 1;
    }
    if (n == 3 && memcmp(v, "inf", 3) == 0) {
        *out = Py_HUGE_VAL;
        return 1;
    }
    if (n == 4 && memcmp(v, "-inf", 4) == 0) {
        *out = -Py_HUGE_VAL;
        return 1;
    }
    return n > 0 && decimal(v, n, 0, out, 1) == NUMBER;
}

/* Match the line s[start:end] (characters of type T) against a dict-line template's ops: any characters
 * but braces, "{", the ops, spaces and tabs (dict_lines._DictTemplate's pattern, ASCII from the "{" on);
 * 1 and the values in row on a match, else 0. One function per width of character (PyUnicode kinds). */
#define MATCH_DICT_LINE(NAME, T)                                                                              \
    static int NAME(const op_t *ops, Py_ssize_t n_ops, const T *s, Py_ssize_t start, Py_ssize_t end,         \
                    double *row) {                                                                            \
        Py_ssize_t i = start;                                                                                 \
        int opened = 0;                                                                                       \
        while (i < end && !opened) {                                                                          \
            T c = s[i++];                                                                                     \
            if (c == '}') return 0;                                                                           \
            opened = c == '{';                                                                                \
        }                                                                                                     \
        if (!opened) return 0;                                                                                \
        int n_row = 0;                                                                                        \
        unsigned char token[64];                                                                              \
        for (Py_ssize_t k = 0; k < n_ops; k++) {                                                              \
            const op_t *op = &ops[k];                                                                         \
            if (op->kind == OP_TEXT) {                                                                       \
                if (end - i < op->len) return 0;                                                              \
                for (Py_ssize_t j = 0; j < op->len; j++)                                                      \
                    if (s[i + j] != (T)(unsigned char)op->text[j]) return 0;                                  \
                i += op->len;                                                                                 \
            } else { /* (a token longer than 64: the next text, which starts with no value character, fails) */ \
                Py_ssize_t t = 0;                                                                             \
                while (i < end && t < (Py_ssize_t)sizeof token && value_char(s[i])) token[t++] = (unsigned char)s[i++]; \
                if (!dict_value(token, t, &row[n_row++])) return 0;                                           \
            }                                                                                                 \
        }                                                                                                     \
        while (i < end && (s[i] == ' ' || s[i] == '\t')) i++;                                                 \
        return i == end;                                                                                      \
    }

/* What a character is to dict_lines below 256: 1 a line break of str.splitlines() (\n \r \v \f \x1c \x1d
 * \x1e \x85), 2 "{", else 0; above, U+2028 and U+2029 are breaks. */
static unsigned char dict_line_chars[256];

static void dict_line_chars_init(void) {
    const unsigned char breaks[] = {'\n', '\r', 0x0b, 0x0c, 0x1c, 0x1d, 0x1e, 0x85};
    for (size_t i = 0; i < sizeof breaks; i++) dict_line_chars[breaks[i]] = 1;
    dict_line_chars['{'] = 2;
}

/* The line of s[0:n] (characters of type T) that starts at at, as str.splitlines() splits: where it ends
 * (*end) and the next starts (*next: after its break, "\r\n" one), and whether it holds a "{". */
#define SCAN_DICT_LINE(NAME, T)                                                                               \
    static int NAME(const T *s, Py_ssize_t n, Py_ssize_t at, Py_ssize_t *end, Py_ssize_t *next) {             \
        int brace = 0;                                                                                        \
        Py_ssize_t i = at;                                                                                    \
        for (; i < n; i++) {                                                                                  \
            T c = s[i];                                                                                       \
            unsigned char what = c < 256 ? dict_line_chars[c] : (c == 0x2028 || c == 0x2029);                 \
            if (what == 1) break;                                                                             \
            brace |= what == 2;                                                                               \
        }                                                                                                     \
        *end = i;                                                                                             \
        *next = i >= n ? n : i + 1 + (s[i] == '\r' && i + 1 < n && s[i + 1] == '\n');                        \
        return brace;                                                                                         \
    }

/* scan_dict_line of UTF-8 bytes s[0:n] (a log's file as it is, not decoded): the lines of the text that
 * decoding them (invalid bytes replaced) gives, at the same places in bytes. Its breaks are the ASCII ones,
 * U+0085 (C2 85) and U+2028/U+2029 (E2 80 A8/A9): sequences the decoder reads as those characters wherever
 * they are (neither C2 nor E2 continues another sequence), and a lone 0x85 byte no break (it decodes to
 * U+FFFD). No byte of a sequence of more than one is ASCII, so a "{" found is one. */
static int scan_dict_line_utf8(const unsigned char *s, Py_ssize_t n, Py_ssize_t at, Py_ssize_t *end,
                               Py_ssize_t *next) {
    int brace = 0;
    Py_ssize_t i = at, width = 1;
#if defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__))
    /* 16 bytes a step past those that cannot matter (ASCII's controls up to 0x1e, "{", C2 85 and E2 80
     * may): a progress bar's line (its blocks E2 96 88) and the spaces that clear it, 0.13 -> 0.03 s of
     * 10^6 Trainer steps */
    const __m128i controls = _mm_set1_epi8(0x1e), open = _mm_set1_epi8('{');
    const __m128i c2 = _mm_set1_epi8((char)0xc2), x85 = _mm_set1_epi8((char)0x85);
    const __m128i e2 = _mm_set1_epi8((char)0xe2), x80 = _mm_set1_epi8((char)0x80);
#endif
    for (; i < n; i++) {
#if defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__))
        while (i + 17 <= n) {
            __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
            __m128i after = _mm_loadu_si128((const __m128i *)(const void *)(s + i + 1));
            __m128i ascii = _mm_or_si128(_mm_cmpeq_epi8(_mm_min_epu8(x, controls), x),
                                         _mm_cmpeq_epi8(x, open));
            __m128i nel = _mm_and_si128(_mm_cmpeq_epi8(x, c2), _mm_cmpeq_epi8(after, x85));
            __m128i separator = _mm_and_si128(_mm_cmpeq_epi8(x, e2), _mm_cmpeq_epi8(after, x80));
            __m128i may = _mm_or_si128(ascii, _mm_or_si128(nel, separator));
            int bits = _mm_movemask_epi8(may);
            if (bits) {
                i += __builtin_ctz((unsigned)bits);
                break;
            }
            i += 16;
        }
        if (i >= n) break;
#endif
        unsigned char c = s[i];
        if (c < 0x80) {
            unsigned char what = dict_line_chars[c];
            if (what == 1) break;
            brace |= what == 2;
        } else if (c == 0xc2 && i + 1 < n && s[i + 1] == 0x85) {
            width = 2;
            break;
        } else if (c == 0xe2 && i + 2 < n && s[i + 1] == 0x80 && (s[i + 2] == 0xa8 || s[i + 2] == 0xa9)) {
            width = 3;
            break;
        }
    }
    *end = i;
    *next = i >= n ? n : i + width + (s[i] == '\r' && i + 1 < n && s[i + 1] == '\n');
    return brace;
}

MATCH_DICT_LINE(match_dict_line_1, Py_UCS1)
MATCH_DICT_LINE(match_dict_line_2, Py_UCS2)
MATCH_DICT_LINE(match_dict_line_4, Py_UCS4)
SCAN_DICT_LINE(scan_dict_line_1, Py_UCS1)
SCAN_DICT_LINE(scan_dict_line_2, Py_UCS2)
SCAN_DICT_LINE(scan_dict_line_4, Py_UCS4)

/* The kind of text dict_lines reads as UTF-8 bytes (matched as 1-byte text: a template's ops and values
 * are ASCII, and no byte of a longer sequence is ASCII; split into lines by scan_dict_line_utf8). */
#define UTF8_BYTES 0

static int match_dict_line(const op_t *ops, Py_ssize_t n_ops, int kind, const void *data, Py_ssize_t start,
                           Py_ssize_t end, double *row) {
    if (kind == PyUnicode_1BYTE_KIND || kind == UTF8_BYTES)
        return match_dict_line_1(ops, n_ops, data, start, end, row);
    if (kind == PyUnicode_2BYTE_KIND) return match_dict_line_2(ops, n_ops, data, start, end, row);
    return match_dict_line_4(ops, n_ops, data, start, end, row);
}

static int scan_dict_line(int kind, const void *data, Py_ssize_t n, Py_ssize_t at, Py_ssize_t *end,
                          Py_ssize_t *next) {
    if (kind == UTF8_BYTES) return scan_dict_line_utf8(data, n, at, end, next);
    if (kind == PyUnicode_1BYTE_KIND) return scan_dict_line_1(data, n, at, end, next);
    if (kind == PyUnicode_2BYTE_KIND) return scan_dict_line_2(data, n, at, end, next);
    return scan_dict_line_4(data, n, at, end, next);
}

/* dict_lines(ops, text, pos, out) -> (stop, rows): the lines of str text from offset pos on (the start of
 * a line; lines as str.splitlines() splits them) that a dict-line template's ops
 * match read, their values appended to out (a list of one bytearray per value op: float64), lines
 * holding no "{" skipped (no dict: no record), up to stop: the offset of the first line holding "{" that
 * they do not match (or len(text)); rows lines were read. text may be a bytes-like object of UTF-8 (a
 * memory-mapped log, not decoded): then the offsets are in bytes, and the lines are those of its text
 * decoded with invalid bytes replaced (scan_dict_line_utf8), read the same. */
static PyObject *dict_lines(PyObject *self, PyObject *args) {
    PyObject *ops_obj, *text, *out;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "O!OnO!", &PyTuple_Type, &ops_obj, &text, &pos, &PyList_Type, &out))
        return NULL;
    Py_buffer view;
    int have_view = PyUnicode_Check(text) ? 0 : 1;
    if (have_view && PyObject_GetBuffer(text, &view, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t n_ops = PyTuple_GET_SIZE(ops_obj), n = have_view ? view.len : PyUnicode_GET_LENGTH(text);
    int values;
    op_t *ops = read_ops(ops_obj, out, 1u << OP_TEXT | 1u << OP_VALUE, 1, 4096, "dict_lines", &values);
    double *rows = NULL;
    Py_ssize_t n_rows = 0, rows_cap = 0;
    if (ops == NULL) goto failed;
    if (pos < 0 || pos > n) {
        PyErr_SetString(PyExc_IndexError, "dict_lines: pos out of range");
        goto failed;
    }
    int kind = have_view ? UTF8_BYTES : PyUnicode_KIND(text);
    const void *data = have_view ? view.buf : PyUnicode_DATA(text);
    Py_ssize_t at = pos;
    while (at < n) {
        Py_ssize_t end, next;
        if (scan_dict_line(kind, data, n, at, &end, &next)) {
            if (n_rows == rows_cap) {
                rows_cap = 2 * rows_cap + 1024;
                double *grown = PyMem_Realloc(rows, (size_t)rows_cap * (size_t)values * sizeof(double));
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto failed;
                }
                rows = grown;
            }
            if (!match_dict_line(ops, n_ops, kind, data, at, end, rows + n_rows * values)) break;
            n_rows++;
        }
        at = next;
    }
    if (append_columns(out, (const int64_t *)(void *)rows, n_rows, values) < 0) goto failed;
    PyMem_Free(ops);
    PyMem_Free(rows);
    if (have_view) PyBuffer_Release(&view);
    return Py_BuildValue("(nn)", at, n_rows);
failed:
    PyMem_Free(ops);
    PyMem_Free(rows);
    if (have_view) PyBuffer_Release(&view);
    return NULL;
}

/* The length of the terminal control sequence at s[i] (characters of type T, n of them), as the pattern
 * \x1b\[[0-9;]*[A-Za-z] matches it there (text_logs._ANSI), or 0 when it does not match there. */
#define ANSI_AT(NAME, T)                                                                                      \
    static Py_ssize_t NAME(const T *s, Py_ssize_t n, Py_ssize_t i) {                                          \
        if (i + 2 >= n || s[i] != 0x1b || s[i + 1] != '[') return 0;                                         \
        Py_ssize_t j = i + 2;                                                                                 \
        while (j < n && ((s[j] >= '0' && s[j] <= '9') || s[j] == ';')) j++;                                  \
        if (j < n && ((s[j] >= 'A' && s[j] <= 'Z') || (s[j] >= 'a' && s[j] <= 'z'))) return j + 1 - i;       \
        return 0;                                                                                             \
    }

/* Copy s[0:n] (characters of type T) to out without its terminal control sequences (when out is NULL,
 * only count); the number of characters kept. Each escape character is found by memchr (1-byte text) or a
 * loop, and a sequence tried there as re.sub tries the pattern: leftmost first, none overlapping (its
 * parameters hold no escape, so the search goes on after a sequence or after an escape that starts
 * none). */
#define STRIP_ANSI(NAME, T, AT)                                                                               \
    static Py_ssize_t NAME(const T *s, Py_ssize_t n, T *out) {                                                \
        Py_ssize_t kept = 0, from = 0, i = 0;                                                                 \
        for (;;) {                                                                                            \
            if (sizeof(T) == 1) {                                                                             \
                const T *e = memchr(s + i, 0x1b, (size_t)(n - i));                                            \
                i = e == NULL ? n : e - s;                                                                    \
            } else {                                                                                          \
                while (i < n && s[i] != 0x1b) i++;                                                            \
            }                                                                                                 \
            if (i >= n) break;                                                                                \
            Py_ssize_t len = AT(s, n, i);                                                                     \
            if (len == 0) {                                                                                   \
                i++;                                                                                          \
                continue;                                                                                     \
            }                                                                                                 \
            if (out != NULL) memcpy(out + kept, s + from, (size_t)(i - from) * sizeof(T));                    \
            kept += i - from;                                                                                 \
            from = i = i + len;                                                                               \
        }                                                                                                     \
        if (out != NULL) memcpy(out + kept, s + from, (size_t)(n - from) * sizeof(T));                        \
        return kept + n - from;                                                                               \
    }

ANSI_AT(ansi_at_1, Py_UCS1)
ANSI_AT(ansi_at_2, Py_UCS2)
ANSI_AT(ansi_at_4, Py_UCS4)
STRIP_ANSI(strip_ansi_1, Py_UCS1, ansi_at_1)
STRIP_ANSI(strip_ansi_2, Py_UCS2, ansi_at_2)
STRIP_ANSI(strip_ansi_4, Py_UCS4, ansi_at_4)

static Py_ssize_t strip_ansi_kind(int kind, const void *data, Py_ssize_t n, void *out) {
    if (kind == PyUnicode_1BYTE_KIND) return strip_ansi_1(data, n, out);
    if (kind == PyUnicode_2BYTE_KIND) return strip_ansi_2(data, n, out);
    return strip_ansi_4(data, n, out);
}

/* without_ansi(text) -> str: text without its terminal control sequences (colours, cursor moves), as
 * re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text) gives it (text itself when it holds no sequence):
 * copied into a new string of text's length, which is then cut to what was kept (one pass, not a count
 * and a copy: torchtitan's 10^6 coloured lines 0.29 -> 0.16 s). The characters removed are ASCII and the
 * others kept, so the result's widest character is text's. */
static PyObject *without_ansi(PyObject *self, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "without_ansi: text must be a str");
        return NULL;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    if (PyUnicode_FindChar(text, 0x1b, 0, n, 1) == -1) {
        Py_INCREF(text);
        return text;
    }
    PyObject *out = PyUnicode_New(n, PyUnicode_MAX_CHAR_VALUE(text));
    if (out == NULL) return NULL;
    Py_ssize_t kept = strip_ansi_kind(kind, data, n, PyUnicode_DATA(out));
    if (kept == n) { /* escapes, but no sequence */
        Py_DECREF(out);
        Py_INCREF(text);
        return text;
    }
    if (PyUnicode_Resize(&out, kept) < 0) return NULL; /* (out released on failure) */
    return out;
}

/* SQLite rows into columns (sqlite_rows: mlflow_store.py, trackio_store.py), through the very SQLite
 * library the sqlite3 module uses: its functions' addresses come from Python (ctypes, from the _sqlite3
 * module's library), so nothing here links against SQLite or needs its header. The declarations below
 * are SQLite's stable C API. */
typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;
typedef struct {
    int (*open_v2)(const char *, sqlite3 **, int, const char *);
    int (*close)(sqlite3 *);
    int (*exec)(sqlite3 *, const char *, void *, void *, char **);
    int (*prepare_v2)(sqlite3 *, const char *, int, sqlite3_stmt **, const char **);
    int (*bind_text)(sqlite3_stmt *, int, const char *, int, void (*)(void *));
    int (*step)(sqlite3_stmt *);
    int (*column_count)(sqlite3_stmt *);
    int (*column_type)(sqlite3_stmt *, int);
    double (*column_double)(sqlite3_stmt *, int);
    long long (*column_int64)(sqlite3_stmt *, int);
    const void *(*column_blob)(sqlite3_stmt *, int);
    const unsigned char *(*column_text)(sqlite3_stmt *, int);
    int (*column_bytes)(sqlite3_stmt *, int);
    int (*finalize)(sqlite3_stmt *);
} sqlite_api_t;
#define SQLITE_API_FUNCTIONS 14
#define SQLITE_OPEN_READONLY 0x00000001
#define SQLITE_OPEN_URI 0x00000040
#define SQLITE_OPEN_NOMUTEX 0x00008000
#define SQLITE_ROW 100
#define SQLITE_DONE 101
#define SQLITE_INTEGER 1
#define SQLITE_FLOAT 2
#define SQLITE_TEXT 3
#define SQLITE_BLOB 4

typedef struct {
    unsigned char *data;
    size_t len, cap;
} growing_t;

static int grow_append(growing_t *g, const void *p, size_t n) {
    if (g->len + n > g->cap) {
        size_t want = 2 * g->cap + n + 4096;
        unsigned char *grown = PyMem_RawRealloc(g->data, want);
        if (grown == NULL) return -1;
        g->data = grown, g->cap = want;
    }
    memcpy(g->data + g->len, p, n);
    g->len += n;
    return 0;
}

/* One value of a result row into its column, as the Python reader takes it; 0, or 1 for a value that
 * reader would take otherwise (or fail on), -1 out of memory. Kinds: 'f' float64 as np.fromiter(...,
 * float64) reads the sqlite3 module's value (an INTEGER converted, a FLOAT, the TEXT "nan"); 'i' int64 (an
 * INTEGER); 'j' bytes, the values joined by "\n" (a BLOB, or ASCII TEXT; neither holding "\n" or "\r"). */
static int take_value(const sqlite_api_t *api, sqlite3_stmt *st, int j, char kind, growing_t *col,
                      long long row) {
    int type = api->column_type(st, j);
    if (kind == 'f' || kind == 'i') {
        double d;
        long long i;
        if (type == SQLITE_INTEGER) {
            i = api->column_int64(st, j);
            d = (double)i;
        } else if (type == SQLITE_FLOAT && kind == 'f') {
            d = api->column_double(st, j);
        } else if (type == SQLITE_TEXT && kind == 'f') {
            const unsigned char *t = api->column_text(st, j);
            if (api->column_bytes(st, j) != 3 || t == NULL || memcmp(t, "nan", 3) != 0) return 1;
            d = Py_NAN;
        } else {
            return 1;
        }
        return kind == 'f' ? grow_append(col, &d, 8) : grow_append(col, &i, 8);
    }
    if (type != SQLITE_BLOB && type != SQLITE_TEXT) return 1;
    const unsigned char *p = type == SQLITE_BLOB ? api->column_blob(st, j) : api->column_text(st, j);
    int n = api->column_bytes(st, j); /* (after the value: the length of the UTF-8 text) */
    if (p == NULL && n > 0) return 1;
    if (n > 0 && (memchr(p, '\n', (size_t)n) != NULL || memchr(p, '\r', (size_t)n) != NULL)) return 1;
    if (type == SQLITE_TEXT) {
        unsigned char high = 0;
        for (int k = 0; k < n; k++) high |= p[k];
        if (high >= 0x80) return 1;
    }
    if (row > 0 && grow_append(col, "\n", 1) < 0) return -1;
    return n > 0 ? grow_append(col, p, (size_t)n) : 0;
}

/* sqlite_rows(api, uri, sql, params, kinds) -> (rows, columns) or None: the rows of the query `sql`
 * (its ? bound to the str params) on the database at the URI `uri`, opened read-only (query_only,
 * trusted_schema off), each column j taken by kinds[j] (see take_value): float64 and int64 as bytes, 'j'
 * as the values joined by line breaks. None when a value is not one of its kind, or SQLite reports
 * anything but rows (the database busy, damaged, ...): the Python reader runs the query then. api: the
 * addresses of SQLite's functions, in sqlite_api_t's order. The GIL is released while SQLite runs. */
static PyObject *sqlite_rows(PyObject *self, PyObject *args) {
    PyObject *api_obj, *params;
    const char *uri, *sql, *kinds;
    if (!PyArg_ParseTuple(args, "O!ssO!s", &PyTuple_Type, &api_obj, &uri, &sql, &PyTuple_Type, &params,
                          &kinds))
        return NULL;
    sqlite_api_t api;
    void **slots = (void **)&api;
    if (PyTuple_GET_SIZE(api_obj) != SQLITE_API_FUNCTIONS ||
        sizeof api != SQLITE_API_FUNCTIONS * sizeof(void *)) {
        PyErr_SetString(PyExc_ValueError, "sqlite_rows: api must hold 14 function addresses");
        return NULL;
    }
    for (int k = 0; k < SQLITE_API_FUNCTIONS; k++) {
        slots[k] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(api_obj, k));
        if (slots[k] == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "sqlite_rows: a NULL function");
            return NULL;
        }
    }
    Py_ssize_t n_params = PyTuple_GET_SIZE(params), width = (Py_ssize_t)strlen(kinds);
    const char *texts[8];
    Py_ssize_t lengths[8];
    if (n_params > 8 || width < 1 || width > 8) {
        PyErr_SetString(PyExc_ValueError, "sqlite_rows: at most 8 params and 1 to 8 columns");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n_params; k++) {
        PyObject *p = PyTuple_GET_ITEM(params, k);
        if (!PyUnicode_Check(p) || (texts[k] = PyUnicode_AsUTF8AndSize(p, &lengths[k])) == NULL ||
            lengths[k] > INT_MAX) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "sqlite_rows: params must be str");
            return NULL;
        }
    }
    for (Py_ssize_t j = 0; j < width; j++)
        if (kinds[j] != 'f' && kinds[j] != 'i' && kinds[j] != 'j') {
            PyErr_SetString(PyExc_ValueError, "sqlite_rows: kinds are 'f', 'i' or 'j'");
            return NULL;
        }
    growing_t cols[8];
    memset(cols, 0, sizeof cols);
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    long long rows = 0;
    int ok = 0, oom = 0;
    Py_BEGIN_ALLOW_THREADS
    if (api.open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, NULL) == 0 &&
        api.exec(db, "PRAGMA query_only = ON; PRAGMA trusted_schema = OFF", NULL, NULL, NULL) == 0 &&
        api.prepare_v2(db, sql, -1, &st, NULL) == 0 && st != NULL && api.column_count(st) == width) {
        int bound = 1;
        for (Py_ssize_t k = 0; k < n_params && bound; k++)
            bound = api.bind_text(st, (int)k + 1, texts[k], (int)lengths[k], (void (*)(void *))-1) == 0;
        int rc = bound ? SQLITE_ROW : 0, got = 0;
        while (bound && (rc = api.step(st)) == SQLITE_ROW) {
            for (Py_ssize_t j = 0; j < width && got == 0; j++)
                got = take_value(&api, st, (int)j, kinds[j], &cols[j], rows);
            if (got != 0) break;
            rows++;
        }
        ok = bound && got == 0 && rc == SQLITE_DONE;
        oom = got < 0;
    }
    if (st != NULL) api.finalize(st);
    if (db != NULL) api.close(db);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (oom) {
        PyErr_NoMemory();
    } else if (!ok) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *out = PyTuple_New(width);
        for (Py_ssize_t j = 0; out != NULL && j < width; j++) {
            const char *data = (const char *)cols[j].data;
            Py_ssize_t len = (Py_ssize_t)cols[j].len;
            PyObject *c = kinds[j] == 'j' ? PyBytes_FromStringAndSize(data, len)
                                          : PyByteArray_FromStringAndSize(data, len);
            if (c == NULL) Py_CLEAR(out);
            else PyTuple_SET_ITEM(out, j, c);
        }
        if (out != NULL) result = Py_BuildValue("(LN)", rows, out);
    }
    for (int j = 0; j < 8; j++) PyMem_RawFree(cols[j].data);
    return result;
}

/* json_rows(text) -> (rows, keys, values, flags, first_keys) or None: JSON Lines of flat objects of numbers
 * (a JSON Lines log; a Trackio project's rows joined by "\n") read into one column per key, without a dict
 * per line. text: bytes-like, or a str of ASCII only. keys: the keys (bytes) in first-seen order, as
 * dict.fromkeys over the lines' dicts gives them; values[k]: float64 bytearray of each row's value of
 * keys[k] (NaN where the row has none); flags[k]: uint8 bytearray, 0 where the row has none, 1 a float, 2
 * an int (exact: at most 15 digits), 3 (JSON_WORD) a string float() cannot read; first_keys: how many keys
 * the first row has. Blank lines are no rows; a key given twice in a row keeps its later value (as
 * json.loads). A value is a JSON number, Python's NaN, Infinity, -Infinity tokens, Trackio's "NaN",
 * "Infinity", "-Infinity" strings (as floats), or a string of printable ASCII without escapes holding a
 * character float() never reads (a time, a name: flag 3, NaN). None for anything else (a line that is not
 * such an object, another string, true, false, null, a nested value,
 * a key with an escape or a byte outside printable ASCII, a number Python reads otherwise, more than
 * JSON_MAX_KEYS keys, or columns that would take more bytes than the text): the caller's decoder decides
 * there. GIL held (the float parser's slow path is CPython's). */
#define JSON_MAX_KEYS (1 << 16) /* a log of each parameter's norm (Lightning's grad_norm): a key per
                                 * parameter (4,096 left a mixture of experts' 5,000 to msgspec: 3.1 s) */
#define JSON_SLOTS (2 * JSON_MAX_KEYS)

typedef struct {
    int col[JSON_SLOTS]; /* a slot's column + 1; 0: an empty slot */
    const unsigned char *name[JSON_MAX_KEYS];
    Py_ssize_t len[JSON_MAX_KEYS];
    double *val[JSON_MAX_KEYS];          /* each column's values */
    unsigned char *flag[JSON_MAX_KEYS];  /* and flags */
    int follow[JSON_MAX_KEYS + 1];       /* the column that came after column c (JSON_MAX_KEYS: row start) */
} json_keys_t;

/* The column of key[0:len]; n_cols (the next column's) for a key not seen before, then taken as it. */
static int json_column(json_keys_t *t, const unsigned char *key, Py_ssize_t len, int n_cols) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (Py_ssize_t k = 0; k < len; k++) h = (h ^ key[k]) * 16777619u;
    for (uint32_t slot = h % JSON_SLOTS;; slot = (slot + 1) % JSON_SLOTS) {
        int c = t->col[slot] - 1;
        if (c < 0) {
            if (n_cols < JSON_MAX_KEYS) {
                t->col[slot] = n_cols + 1;
                t->name[n_cols] = key;
                t->len[n_cols] = len;
            }
            return n_cols;
        }
        if (t->len[c] == len && memcmp(t->name[c], key, (size_t)len) == 0) return c;
    }
}

static int json_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* The printable ASCII characters float() may read in a string ("1.5", " -inf ", "1_000", "NaN",
 * "Infinity"): a string holding any other is no number to gradtool's _num, whatever the rest of it (a time
 * "2024-01-01T10:00:00", a run's name), and json_rows gives its key flag JSON_WORD there. */
#define JSON_WORD 3
static unsigned char json_float_char[256];

static void json_float_chars_init(void) {
    const char *chars = " 0123456789._+-eEnNaAiIfFtTyY";
    for (const char *c = chars; *c; c++) json_float_char[(unsigned char)*c] = 1;
}

/* A JSON value token v[0:n] (no string) as json.loads reads it: INTEGER, NUMBER (in *out) or UNSURE. */
static int json_number(const unsigned char *v, Py_ssize_t n, double *out) {
    Py_ssize_t i = n > 0 && v[0] == '-';
    Py_ssize_t first = i;
    while (i < n && v[i] >= '0' && v[i] <= '9') i++;
    if (i == n && i > first) { /* an integer: int() of it */
        if (i - first > 15 || (v[first] == '0' && i - first > 1)) return UNSURE;
        int64_t x = 0;
        for (Py_ssize_t k = first; k < n; k++) x = x * 10 + (v[k] - '0');
        *out = (double)(first ? -x : x); /* -0: 0, as int("-0") */
        return INTEGER;
    }
    return classify(v, n, out, 1); /* Python's NaN, Infinity, -Infinity tokens, or a JSON number */
}

/* The bytes of a log's text: a str of ASCII (1, borrowed: its own bytes), a bytes-like object (1, its buffer
 * held in *view until released), a str of other characters (0: the caller gives no answer), or an error
 * (-1, set). */
static int text_bytes(PyObject *arg, Py_buffer *view, int *have_view, const unsigned char **b,
                      Py_ssize_t *n) {
    *have_view = 0;
    if (PyUnicode_Check(arg)) {
        if (!PyUnicode_IS_ASCII(arg)) return 0;
        *b = PyUnicode_DATA(arg);
        *n = PyUnicode_GET_LENGTH(arg);
        return 1;
    }
    if (PyObject_GetBuffer(arg, view, PyBUF_SIMPLE) < 0) return -1;
    *have_view = 1;
    *b = view->buf;
    *n = view->len;
    return 1;
}

/* json_rows' reader of text b[0:n]: JSON Lines (array 0), or (array 1) the JSON array of flat objects that
 * starts at b[start] ("[", after blanks), any blanks and line breaks between its tokens, its end offset
 * (after its "]") in *end. */
static PyObject *json_table(const unsigned char *b, Py_ssize_t n, int array, Py_ssize_t start, Py_ssize_t *end);

static PyObject *json_rows(PyObject *self, PyObject *arg) {
    Py_buffer view;
    const unsigned char *b;
    Py_ssize_t n, end;
    int have_view, got = text_bytes(arg, &view, &have_view, &b, &n);
    if (got <= 0) return got < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *result = json_table(b, n, 0, 0, &end);
    if (have_view) PyBuffer_Release(&view);
    return result;
}

/* json_array_rows(text, start) -> (rows, keys, values, flags, first_keys, end) or None: json_rows of the
 * JSON array of flat objects at offset start of text (a trainer_state.json's log_history, each object
 * over several lines), end the offset after its "]"; None where json_rows gives None, for an element that
 * is no such object, or an array json.loads would refuse. */
static PyObject *json_array_rows(PyObject *self, PyObject *args) {
    PyObject *text;
    Py_ssize_t start, end = 0;
    Py_buffer view;
    const unsigned char *b;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "On", &text, &start)) return NULL;
    int have_view, got = text_bytes(text, &view, &have_view, &b, &n);
    if (got <= 0) return got < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *result = start < 0 || start > n ? Py_NewRef(Py_None) : json_table(b, n, 1, start, &end);
    if (have_view) PyBuffer_Release(&view);
    if (result == NULL || result == Py_None) return result;
    PyObject *with_end = Py_BuildValue("(OOOOOn)", PyTuple_GET_ITEM(result, 0), PyTuple_GET_ITEM(result, 1),
                                       PyTuple_GET_ITEM(result, 2), PyTuple_GET_ITEM(result, 3),
                                       PyTuple_GET_ITEM(result, 4), end);
    Py_DECREF(result);
    return with_end;
}

static PyObject *json_table(const unsigned char *b, Py_ssize_t n, int array, Py_ssize_t start, Py_ssize_t *end) {
#define BLANK(c) (json_space(c) || (array && (c) == '\n'))
    Py_ssize_t lines = 1; /* rows at most: lines, or objects ("{") of an array */
    for (const unsigned char *p = b + start, *e = b + n; (p = memchr(p, array ? '{' : '\n', (size_t)(e - p))) != NULL;
         p++)
        lines++;
    json_keys_t *keys = PyMem_Calloc(1, sizeof(json_keys_t));
    PyObject *values = PyList_New(0), *flags = PyList_New(0), *result = NULL;
    double **val = keys == NULL ? NULL : keys->val;
    unsigned char **flag = keys == NULL ? NULL : keys->flag;
    int *follow = keys == NULL ? NULL : keys->follow;
    for (int c = 0; follow != NULL && c <= JSON_MAX_KEYS; c++) follow[c] = -1;
    int n_cols = 0, first_keys = -1, ok = keys != NULL && values != NULL && flags != NULL;
    if (keys == NULL) PyErr_NoMemory();
    Py_ssize_t i = start, row = 0;
    int closed = !array; /* an array's "]" read */
    if (array) {
        while (i < n && BLANK(b[i])) i++;
        if (i >= n || b[i++] != '[') goto give_up;
        while (i < n && BLANK(b[i])) i++;
        if (i < n && b[i] == ']') {
            closed = 1;
            *end = ++i;
        }
    }
    while (ok && i < n && !(array && closed)) {
        while (i < n && BLANK(b[i])) i++;
        if (i == n) break;
        if (b[i] == '\n') {
            i++;
            continue;
        }
        if (b[i++] != '{') goto give_up;
        int after = JSON_MAX_KEYS;
        while (i < n && BLANK(b[i])) i++;
        int empty = i < n && b[i] == '}';
        if (empty) i++;
        while (!empty) {
            if (i >= n || b[i] != '"') goto give_up;
            Py_ssize_t k0 = ++i, klen;
            int c = follow[after]; /* the key that came next last time (a log's rows repeat their keys) */
            if (c >= 0 && (klen = keys->len[c]) < n - k0 && b[k0 + klen] == '"' &&
                memcmp(b + k0, keys->name[c], (size_t)klen) == 0) {
                i = k0 + klen + 1;
            } else {
                c = -1;
                while (i < n && b[i] != '"') {
                    if (b[i] < 0x20 || b[i] >= 0x7F || b[i] == '\\') goto give_up;
                    i++;
                }
                if (i >= n) goto give_up;
                klen = i++ - k0;
            }
            while (i < n && BLANK(b[i])) i++;
            if (i >= n || b[i++] != ':') goto give_up;
            while (i < n && BLANK(b[i])) i++;
            double x = 0.0;
            int kind;
            if (i < n && b[i] == '"') { /* Trackio's nonfinite floats, or a word (a time, a name) */
                Py_ssize_t v0 = ++i;
                int word = 0; /* a character float() never reads: no number, whatever the rest */
                for (; i < n && b[i] != '"'; i++) {
                    if (b[i] < 0x20 || b[i] >= 0x7F || b[i] == '\\') goto give_up; /* (escapes: json's) */
                    word |= !json_float_char[b[i]];
                }
                if (i >= n) goto give_up;
                Py_ssize_t vlen = i++ - v0;
                if ((vlen == 3 && memcmp(b + v0, "NaN", 3) == 0) || (vlen == 8 && memcmp(b + v0, "Infinity", 8) == 0) ||
                    (vlen == 9 && memcmp(b + v0, "-Infinity", 9) == 0))
                    kind = classify(b + v0, vlen, &x, 1);
                else if (word)
                    kind = JSON_WORD, x = Py_NAN;
                else
                    goto give_up; /* (a string float() may read: "1.5", " nan ", "1_000") */
            } else {
                Py_ssize_t v0 = i;
                while (i < n && b[i] != ',' && b[i] != '}' && b[i] != '\n' && !json_space(b[i])) i++;
                kind = json_number(b + v0, i - v0, &x);
            }
            if (kind != NUMBER && kind != INTEGER && kind != JSON_WORD) goto give_up;
            if (c < 0) c = json_column(keys, b + k0, klen, n_cols);
            if (c == n_cols) { /* a new key: its columns, NaN and 0 so far */
                if (n_cols == JSON_MAX_KEYS || (double)(n_cols + 1) * 9.0 * (double)lines > n + 4096.0)
                    goto give_up; /* the columns would take more than the text */
                PyObject *v = PyByteArray_FromStringAndSize(NULL, lines * (Py_ssize_t)sizeof(double));
                PyObject *f = v == NULL ? NULL : PyByteArray_FromStringAndSize(NULL, lines);
                int failed = f == NULL || PyList_Append(values, v) < 0 || PyList_Append(flags, f) < 0;
                Py_XDECREF(v);
                Py_XDECREF(f);
                if (failed) {
                    ok = 0;
                    break;
                }
                val[n_cols] = (double *)PyByteArray_AS_STRING(v);
                flag[n_cols] = (unsigned char *)PyByteArray_AS_STRING(f);
                for (Py_ssize_t r = 0; r < lines; r++) val[n_cols][r] = Py_NAN;
                memset(flag[n_cols], 0, (size_t)lines);
                n_cols++;
            }
            follow[after] = c;
            after = c;
            val[c][row] = x;
            flag[c][row] = kind == INTEGER ? 2 : kind == JSON_WORD ? 3 : 1;
            while (i < n && BLANK(b[i])) i++;
            if (i < n && b[i] == ',') {
                i++;
                while (i < n && BLANK(b[i])) i++;
                continue;
            }
            if (i < n && b[i] == '}') {
                i++;
                break;
            }
            goto give_up;
        }
        if (!ok) break;
        if (first_keys < 0) first_keys = n_cols;
        row++;
        if (array) { /* "," and the next object, or "]" */
            while (i < n && BLANK(b[i])) i++;
            if (i < n && b[i] == ',') { /* (the next element: an object, or it gives up above) */
                i++;
                continue;
            }
            if (i >= n || b[i] != ']') goto give_up;
            closed = 1;
            *end = ++i;
            break;
        }
        while (i < n && json_space(b[i])) i++;
        if (i < n && b[i] != '\n') goto give_up;
    }
    if (ok && !closed) goto give_up;
    if (ok) {
        PyObject *names = PyList_New(n_cols);
        for (int c = 0; names != NULL && c < n_cols; c++) {
            PyObject *name = PyBytes_FromStringAndSize((const char *)keys->name[c], keys->len[c]);
            if (name == NULL) Py_CLEAR(names);
            else PyList_SET_ITEM(names, c, name);
        }
        for (int c = 0; names != NULL && c < n_cols; c++)
            if (PyByteArray_Resize(PyList_GET_ITEM(values, c), row * (Py_ssize_t)sizeof(double)) < 0 ||
                PyByteArray_Resize(PyList_GET_ITEM(flags, c), row) < 0)
                Py_CLEAR(names);
        if (names != NULL)
            result = Py_BuildValue("(nNOOi)", row, names, values, flags, first_keys < 0 ? 0 : first_keys);
    }
    goto done;
give_up:
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(keys);
    Py_XDECREF(values);
    Py_XDECREF(flags);
    return result;
#undef BLANK
}

/* A CSV cell v[0:n] as gradtool's _num(cell) reads it (logs.py): NOT_A_NUMBER (empty, or a word float()
 * refuses), NUMBER (in *out) or UNSURE (left to Python: a number of another form, a control character).
 * Spaces and tabs around it are stripped; a word is nan, inf or infinity in any case, signed or not. */
static int csv_cell(const unsigned char *v, Py_ssize_t n, double *out) {
    while (n > 0 && (v[0] == ' ' || v[0] == '\t')) v++, n--;
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
    if (n == 0) return NOT_A_NUMBER;
    if (n > 128) return UNSURE;
    Py_ssize_t i = v[0] == '+' || v[0] == '-';
    unsigned char c = i < n ? (unsigned char)(v[i] | 0x20) : 0;
    if (c < 'a' || c > 'z') return decimal(v, n, 0, out, 1);
    char low[9] = {0};
    for (Py_ssize_t k = 0; k < n; k++) {
        if (v[k] <= 0x20 || v[k] >= 0x7F) return UNSURE; /* (a space inside, a control or non-ASCII byte) */
        if (k >= i && k - i < 8) low[k - i] = (char)(v[k] >= 'A' && v[k] <= 'Z' ? v[k] | 0x20 : v[k]);
    }
    if (n - i == 3 && memcmp(low, "nan", 3) == 0) {
        *out = Py_NAN; /* (_num: "-nan" is nan) */
        return NUMBER;
    }
    if ((n - i == 3 && memcmp(low, "inf", 3) == 0) || (n - i == 8 && memcmp(low, "infinity", 8) == 0)) {
        *out = v[0] == '-' ? -Py_HUGE_VAL : Py_HUGE_VAL;
        return NUMBER;
    }
    return NOT_A_NUMBER;
}

/* csv_columns(text, ncols, delim) -> (rows, width, values, flags) or None: the lines of a CSV's body (the
 * text after its header line; str of ASCII, or bytes) as the csv module splits them when no cell is quoted
 * (a line break ends a row, "\r\n" too; a blank line is a row of no cell; no row after the last line
 * break), each of the first ncols cells read by csv_cell into one float64 column per header column (NaN
 * where no number) and one uint8 column of flags (0: no number, 1: a number); cells beyond ncols are left
 * out, as the general reader leaves them. width: the most cells of a row (capped at ncols). None (the
 * csv module decides) for a quote, a NUL or a lone "\r" anywhere, a cell csv_cell is unsure of, or
 * columns that would take far more memory than the text. */
static PyObject *csv_columns(PyObject *self, PyObject *args) {
    PyObject *arg;
    Py_ssize_t ncols;
    int delim;
    if (!PyArg_ParseTuple(args, "OnC", &arg, &ncols, &delim)) return NULL;
    Py_buffer view;
    const unsigned char *b;
    Py_ssize_t n;
    int have_view, got = text_bytes(arg, &view, &have_view, &b, &n);
    if (got <= 0) return got < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *values = NULL, *flags = NULL, *result = NULL;
    double **val = NULL;
    unsigned char **flag = NULL;
    if (ncols < 1 || ncols > (1 << 16) || delim < 1 || delim > 0x7E || delim == '"' || delim == '\r' ||
        delim == '\n' || memchr(b, '"', (size_t)n) != NULL || memchr(b, 0, (size_t)n) != NULL)
        goto give_up;
    Py_ssize_t rows = n > 0 && b[n - 1] != '\n';
    for (const unsigned char *p = b, *end = b + n; (p = memchr(p, '\n', (size_t)(end - p))) != NULL; p++)
        rows++;
    if ((double)ncols * (double)rows * 9.0 > 16.0 * (double)n + (double)(1 << 24))
        goto give_up; /* the columns would take far more than the text (short rows under a wide header) */
    values = PyList_New(ncols);
    flags = PyList_New(ncols);
    val = PyMem_Calloc((size_t)ncols, sizeof(double *));
    flag = PyMem_Calloc((size_t)ncols, sizeof(unsigned char *));
    if (values == NULL || flags == NULL || val == NULL || flag == NULL) {
        if (val == NULL || flag == NULL) PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *v = PyByteArray_FromStringAndSize(NULL, rows * (Py_ssize_t)sizeof(double));
        PyObject *f = v == NULL ? NULL : PyByteArray_FromStringAndSize(NULL, rows);
        if (f == NULL) {
            Py_XDECREF(v);
            goto done;
        }
        PyList_SET_ITEM(values, c, v);
        PyList_SET_ITEM(flags, c, f);
        val[c] = (double *)PyByteArray_AS_STRING(v);
        flag[c] = (unsigned char *)PyByteArray_AS_STRING(f);
        for (Py_ssize_t r = 0; r < rows; r++) val[c][r] = Py_NAN;
        memset(flag[c], 0, (size_t)rows);
    }
    Py_ssize_t width = 0, row = 0, i = 0;
    while (i < n) {
        const unsigned char *nl = memchr(b + i, '\n', (size_t)(n - i));
        Py_ssize_t e = nl == NULL ? n : nl - b, le = e;
        if (le > i && b[le - 1] == '\r') le--;
        if (le > i && memchr(b + i, '\r', (size_t)(le - i)) != NULL) goto give_up;
        if (le > i) {
            Py_ssize_t s = i, c = 0;
            while (1) {
                const unsigned char *d = memchr(b + s, delim, (size_t)(le - s));
                Py_ssize_t end = d == NULL ? le : d - b;
                if (c < ncols) {
                    double x = 0.0;
                    int kind = csv_cell(b + s, end - s, &x);
                    if (kind == UNSURE) goto give_up;
                    if (kind == NUMBER) {
                        val[c][row] = x;
                        flag[c][row] = 1;
                    }
                }
                c++;
                if (d == NULL) break;
                s = end + 1;
            }
            if (c > width) width = c < ncols ? c : ncols;
        }
        row++;
        i = e + 1;
    }
    result = Py_BuildValue("(nnOO)", row, width, values, flags);
    goto done;
give_up:
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(val);
    PyMem_Free(flag);
    Py_XDECREF(values);
    Py_XDECREF(flags);
    if (have_view) PyBuffer_Release(&view);
    return result;
}

/* item_columns(values, rows, ids, n_rows, n_keys) -> (values, flags): the (row, key, value) items a reader
 * gathered (values float64, rows int32 in logging order, ids int32 key << 1 | is_int; see wandb_block) as
 * one float64 column of each key's value per row (NaN where the row has none) and one uint8 column of flags
 * (0: none, 1: a float, 2: an int), a row's later item of a key replacing an earlier one; the columns of
 * json_rows. ValueError for an item out of range. */
static PyObject *item_columns(PyObject *self, PyObject *args) {
    Py_buffer vv, rv, iv;
    Py_ssize_t n_rows, n_keys;
    if (!PyArg_ParseTuple(args, "y*y*y*nn", &vv, &rv, &iv, &n_rows, &n_keys)) return NULL;
    PyObject *values = NULL, *flags = NULL, *result = NULL;
    double **column = NULL;
    unsigned char **flag = NULL;
    Py_ssize_t n = vv.len / (Py_ssize_t)sizeof(double);
    if (rv.len != n * (Py_ssize_t)sizeof(int32_t) || iv.len != rv.len || n_rows < 0 || n_keys < 0 ||
        n_keys > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "items of different lengths, or a bad count");
        goto done;
    }
    values = PyList_New(n_keys);
    flags = PyList_New(n_keys);
    if (values == NULL || flags == NULL) goto done;
    for (Py_ssize_t k = 0; k < n_keys; k++) {
        PyObject *v = PyByteArray_FromStringAndSize(NULL, n_rows * (Py_ssize_t)sizeof(double));
        if (v == NULL) goto done;
        PyList_SET_ITEM(values, k, v);
        PyObject *f = PyByteArray_FromStringAndSize(NULL, n_rows);
        if (f == NULL) goto done;
        PyList_SET_ITEM(flags, k, f);
        double *d = (double *)PyByteArray_AS_STRING(v);
        for (Py_ssize_t r = 0; r < n_rows; r++) d[r] = Py_NAN;
        memset(PyByteArray_AS_STRING(f), 0, (size_t)n_rows);
    }
    column = PyMem_Calloc((size_t)n_keys + 1, sizeof(double *));
    flag = PyMem_Calloc((size_t)n_keys + 1, sizeof(unsigned char *));
    if (column == NULL || flag == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < n_keys; k++) {
        column[k] = (double *)PyByteArray_AS_STRING(PyList_GET_ITEM(values, k));
        flag[k] = (unsigned char *)PyByteArray_AS_STRING(PyList_GET_ITEM(flags, k));
    }
    const double *value = vv.buf;
    const int32_t *row = rv.buf, *id = iv.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t r = row[i], k = id[i] >> 1;
        if (r < 0 || r >= n_rows || k < 0 || k >= n_keys) {
            PyErr_SetString(PyExc_ValueError, "an item's row or key out of range");
            goto done;
        }
        column[k][r] = value[i];
        flag[k][r] = (id[i] & 1) ? 2 : 1;
    }
    result = PyTuple_Pack(2, values, flags);
done:
    PyMem_Free(column);
    PyMem_Free(flag);
    Py_XDECREF(values);
    Py_XDECREF(flags);
    PyBuffer_Release(&vv);
    PyBuffer_Release(&rv);
    PyBuffer_Release(&iv);
    return result;
}

/* zlib.crc32 lets go of the GIL from 5 KiB; below 64 KiB the release costs more than it frees */
#define CRC_WITHOUT_GIL (64 * 1024)

static PyObject *crc32(PyObject *self, PyObject *args) {
    Py_buffer view;
    unsigned int crc = 0;
    int simd = CRC_SIMD_BEST;
    if (!PyArg_ParseTuple(args, "y*|Ii", &view, &crc, &simd)) return NULL;
    uint32_t out;
    if (view.len >= CRC_WITHOUT_GIL) { /* an npz member's megabytes: let the other thread run meanwhile */
        Py_BEGIN_ALLOW_THREADS
        out = crc32_with(crc, view.buf, view.len, simd);
        Py_END_ALLOW_THREADS
    } else {
        out = crc32_with(crc, view.buf, view.len, simd);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(out);
}

/* The first place of needle[0:m] in s[0:n] or NULL: the C library's memmem where it has one (glibc's
 * searches a 228 MB log for an absent word ~4x faster than bytes.find), else memchr and memcmp. */
static const char *find_bytes(const char *s, Py_ssize_t n, const char *needle, Py_ssize_t m) {
    if (m == 0) return s;
#if defined(__linux__) || defined(__APPLE__) || defined(__FreeBSD__) || defined(__NetBSD__) || defined(__OpenBSD__)
    return memmem(s, (size_t)n, needle, (size_t)m);
#else
    for (const char *end = s + n - m + 1; s < end; s++) {
        s = memchr(s, needle[0], (size_t)(end - s));
        if (s == NULL) return NULL;
        if (memcmp(s, needle, (size_t)m) == 0) return s;
    }
    return NULL;
#endif
}

/* find(data, needle, start) -> data.find(needle, start) for bytes-like data and start >= 0 (a memory map's
 * find is bytes.find's, ~2.6 GB/s on a log). */
static PyObject *find(PyObject *self, PyObject *args) {
    Py_buffer data, needle;
    Py_ssize_t start, found = -1;
    if (!PyArg_ParseTuple(args, "y*y*n", &data, &needle, &start)) return NULL;
    if (start < 0) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&needle);
        PyErr_SetString(PyExc_ValueError, "find: start < 0");
        return NULL;
    }
    if (start <= data.len && needle.len <= data.len - start) {
        const char *at;
        Py_BEGIN_ALLOW_THREADS
        at = find_bytes((const char *)data.buf + start, data.len - start, needle.buf, needle.len);
        Py_END_ALLOW_THREADS
        if (at != NULL) found = at - (const char *)data.buf;
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&needle);
    return PyLong_FromSsize_t(found);
}

static PyObject *crc32_simd(PyObject *self, PyObject *unused) {
#ifdef CLMUL_CRC
    return PyLong_FromLong(zclmul_crc ? 3 : vclmul_crc ? 2 : clmul_crc);
#else
    return PyLong_FromLong(0);
#endif
}

static PyObject *number(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    double x = 0.0;
    int kind = classify(view.buf, view.len, &x, 1);
    PyBuffer_Release(&view);
    return Py_BuildValue("(id)", kind, x);
}

static PyMethodDef methods[] = {
    {"wandb_block", wandb_block, METH_VARARGS,
     "wandb_block(block, at, row, out) -> (stop, rows): the history rows of the whole W&B records from byte\n"
     "at of one 32 KiB block, up to the first record it leaves to the Python reader, appended to out (see\n"
     "_logscan.c)."},
    {"wandb_record", wandb_record, METH_VARARGS,
     "wandb_record(data, row, out) -> 1 (a history row, appended to out), 0 (another record) or -1 (left to\n"
     "the Python reader): one whole W&B record's data."},
    {"key_table", key_table, METH_VARARGS,
     "key_table([max_keys]) -> a key table wandb_block and wandb_record keep from one call to the next, as\n"
     "the sixth item of out (see _logscan.c)."},
    {"tfrecord_frames", tfrecord_frames, METH_O,
     "tfrecord_frames(buffer) -> (starts, lengths, end, bad_length, data_ok): the whole TFRecord records of\n"
     "a buffer, their length CRCs checked and data CRCs computed (see _logscan.c)."},
    {"tfevent_scalars", tfevent_scalars, METH_VARARGS,
     "tfevent_scalars(buffer, starts, lengths) -> (found, steps, values, tags, names, kinds): the records\n"
     "laid out as add_scalar or tf.summary.scalar writes one scalar's event, read (see _logscan.c)."},
    {"mlflow_metric_lines", mlflow_metric_lines, METH_O,
     "mlflow_metric_lines(buffer) -> (steps, timestamps, values) bytes of int64, int64, float64, or None:\n"
     "an MLflow metric file of '<timestamp> <value> <step>' lines (see _logscan.c)."},
    {"newline_lines", newline_lines, METH_O,
     "newline_lines(text) -> str | None: text with every line break str.splitlines() knows made \"\\n\"\n"
     "(\"\\r\\n\" one); text itself when it has none but \"\\n\"; None when it holds U+0085, U+2028 or\n"
     "U+2029 (text_logs._newline_lines's work)."},
    {"template_text", template_text, METH_VARARGS,
     "template_text(ops, text, pos, out[, strict]) -> (stop, resume, rows): the lines of text from offset\n"
     "pos that a text log template's ops match, their numbers appended to out, up to the first norm line\n"
     "(strict: line) they do not match (see _logscan.c)."},
    {"dict_lines", dict_lines, METH_VARARGS,
     "dict_lines(ops, text, pos, out) -> (stop, rows): the lines of text (as str.splitlines() splits it;\n"
     "or UTF-8 bytes, as their decoded text splits) from offset pos that a dict-line template's ops match,\n"
     "their values appended to out, lines without '{' skipped, up to the first line with '{' they do not\n"
     "match (see _logscan.c)."},
    {"without_ansi", without_ansi, METH_O,
     "without_ansi(text) -> str: text without its terminal control sequences, as\n"
     "re.sub(r'\\x1b\\[[0-9;]*[A-Za-z]', '', text) gives it (see _logscan.c)."},
    {"sqlite_rows", sqlite_rows, METH_VARARGS,
     "sqlite_rows(api, uri, sql, params, kinds) -> (rows, columns) or None: a read-only query's rows as\n"
     "columns, through SQLite's functions at the addresses api (see _logscan.c)."},
    {"csv_columns", csv_columns, METH_VARARGS,
     "csv_columns(text, ncols, delim) -> (rows, width, values, flags) or None: a CSV body of numbers and\n"
     "empty cells as one float64 column and one uint8 column of flags (0 no number, 1 a number) per column\n"
     "(see _logscan.c)."},
    {"json_array_rows", json_array_rows, METH_VARARGS,
     "json_array_rows(text, start) -> (rows, keys, values, flags, first_keys, end) or None: json_rows of\n"
     "the JSON array of flat objects at offset start of text, end the offset after it (see _logscan.c)."},
    {"json_rows", json_rows, METH_O,
     "json_rows(text) -> (rows, keys, values, flags, first_keys) or None: JSON Lines of flat objects of\n"
     "numbers as one float64 column and one uint8 column of flags (0 absent, 1 float, 2 int) per key (see\n"
     "_logscan.c)."},
    {"item_columns", item_columns, METH_VARARGS,
     "item_columns(values, rows, ids, n_rows, n_keys) -> (values, flags): gathered (row, key, value) items\n"
     "as one float64 and one uint8 flags column per key, as json_rows gives them (see _logscan.c)."},
    {"crc32", crc32, METH_VARARGS,
     "crc32(data[, crc[, simd]]) -> zlib.crc32(data, crc), as wandb_block computes it (npz members' CRC-32\n"
     "where python-isal is not installed; the GIL released from 64 KiB; simd=0 (False): by the tables\n"
     "only, 1: PCLMULQDQ at most, 2: VPCLMULQDQ on 256-bit vectors at most, 3 (the default): on 512-bit\n"
     "ones where the CPU has AVX-512)."},
    {"find", find, METH_VARARGS,
     "find(data, needle, start) -> data.find(needle, start) of bytes-like data, start >= 0, by memmem (see\n"
     "_logscan.c)."},
    {"crc32_simd", crc32_simd, METH_NOARGS,
     "crc32_simd() -> how CRC-32 is computed here: 3 by VPCLMULQDQ on 512-bit vectors (AVX-512), 2 on\n"
     "256-bit ones, 1 by PCLMULQDQ, 0 by the tables."},
    {"number", number, METH_O,
     "number(value_json) -> (kind, value): how wandb_block classifies a history value: 0 not a number, 1 a\n"
     "float, 2 an int (exact), -1 left to Python (tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "gradtool.io._logscan",
                                    "Optional compiled log readers (see _logscan.c).", -1, methods};

PyMODINIT_FUNC PyInit__logscan(void) {
    dict_line_chars_init();
    json_float_chars_init();
    crc32_setup();
    crc_init(crc32c_tables, 0x82F63B78u);
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "TEMPLATE_BAR", OP_BAR) < 0) Py_CLEAR(m);
    return m;
}
