/* The lists of numbers of one JSON line, read straight into arrays (app/ingest/_columns.py).
 *
 * read_lists(buffer, start, stop, threads) finds every "[" of buffer[start:stop] and reads the list
 * it opens, on `threads` threads with the GIL released. It answers a list of
 * (open, close, kind, data) -- open at "[", close at its "]", data a buffer of the values -- or
 * None when any "[" does not open a flat list of JSON numbers and nulls alone or of true/false
 * alone (a string, a nested list or object, an integer beyond int64, a number beyond float64,
 * anything that is not JSON): the caller then reads the line another way. The kinds:
 *   1  every entry an integer in int64       data: int64 values
 *   2  numbers, at least one with a fraction or an exponent   data: float64 values
 *   3  true/false                              data: one byte per entry, 0 or 1
 *   4  empty                                   data: empty
 *   5  numbers and at least one null           data: float64 values, NaN for each null
 *
 * The numbers are exact: each decimal becomes the float64 nearest to it (ties to even), the value
 * Python's float() gives, and an integer in a list of floats the float64 nearest to it, as Python's
 * float(int) gives; -0 as an integer is 0, -0.0 as a float keeps its sign. Three ways, fastest
 * first: a decimal of at most 2^53 with a power of ten up to 10^22 is one exact multiplication or
 * division (Clinger 1990); any other of at most 19 significant digits is its 64-bit digits times a
 * 128-bit truncated power of five (_pow5.h), whose leading bits are used only when the truncation
 * provably cannot reach them (Lemire, "Number Parsing at a Gigabyte per Second", 2021); the rest --
 * more digits, results near overflow or below the normal range, and the products too close to call
 * -- go to the C library's strtod, which rounds correctly.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_pow5.h"

enum { K_INT = 1, K_FLOAT = 2, K_BOOL = 3, K_EMPTY = 4, K_NULLS = 5 };
#define MAX_THREADS 16

/* ---------------------------------------------------------------- decimal -> float64, exactly */

static const double EXACT_POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                       1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                       1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* w * 10^q for 1 <= w < 2^64 from the truncated power of five; 0 when the product cannot decide
 * the result (or it is not a normal float64), so that the caller asks strtod. */
static int from_pow5(uint64_t w, int q, double *out) {
    if (q < POW5_Q_MIN || q > POW5_Q_MAX) return 0;
    const uint64_t th = POW5[q - POW5_Q_MIN].hi, tl = POW5[q - POW5_Q_MIN].lo;
    const int s = POW5[q - POW5_Q_MIN].shift; /* 5^q * 2^s lies in [T, T + 1), T = th:tl */
    const int lz = __builtin_clzll(w);
    const uint64_t W = w << lz; /* 2^63 <= W < 2^64 */
    /* P = W * T exactly, 192 bits p2:p1:p0; the true R = W * 5^q * 2^s lies in [P, P + W). */
    const __uint128_t a = (__uint128_t)W * tl, b = (__uint128_t)W * th;
    const uint64_t p0 = (uint64_t)a;
    const __uint128_t mid = (__uint128_t)(uint64_t)b + (uint64_t)(a >> 64);
    const uint64_t p1 = (uint64_t)mid;
    const uint64_t p2 = (uint64_t)(b >> 64) + (uint64_t)(mid >> 64);
    /* P < 2^192 and P >= 2^190: its leading bit is 191 or 190. Keep 54 bits (53 and the rounding
     * bit): m = floor(P / 2^k), k = top - 53, i.e. p2 >> cut with cut = 10 or 9. */
    const int cut = (p2 >> 63) ? 10 : 9;
    const uint64_t m = p2 >> cut;
    const uint64_t rest_hi = p2 & ((1ull << cut) - 1); /* P mod 2^k is rest_hi:p1:p0 */
    /* floor(R / 2^k) = m unless P mod 2^k >= 2^k - W (adding up to W carries into m). */
    if (rest_hi == (1ull << cut) - 1 && p1 == UINT64_MAX && p0 + W < p0) return 0;
    /* R mod 2^k >= P mod 2^k: when that is not 0, R is strictly past m * 2^k, so the rounding bit
     * alone decides (never a tie). When it is 0, R may be exact: strtod decides. */
    if (rest_hi == 0 && p1 == 0 && p0 == 0) return 0;
    uint64_t mant = (m >> 1) + (m & 1);
    /* value = mant * 2^e: R = m * 2^k + ..., value = R * 2^(q - s - lz), mant ~ m / 2 */
    int64_t e = (int64_t)(cut + 128 + 1) + q - s - lz; /* k + 1 = (top - 53) + 1, top = cut + 181 */
    if (mant == (1ull << 53)) {
        mant >>= 1;
        e += 1;
    }
    const int64_t biased = e + 52 + 1023;
    if (biased <= 0 || biased >= 2047) return 0; /* below the normal range, or overflow: strtod */
    const uint64_t bits = ((uint64_t)biased << 52) | (mant & ((1ull << 52) - 1));
    memcpy(out, &bits, sizeof bits);
    return 1;
}

/* Eight digits at a time (SWAR) reads a little-endian word; elsewhere one digit at a time. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SWAR 1
#else
#define SWAR 0
#endif

/* Eight ASCII digits at p, when they are. */
static inline int eight_digits(const unsigned char *p) {
    if (!SWAR) return 0;
    uint64_t v;
    memcpy(&v, p, 8);
    return (((v & 0xF0F0F0F0F0F0F0F0ull) | (((v + 0x0606060606060606ull) & 0xF0F0F0F0F0F0F0F0ull) >> 4)) ==
            0x3333333333333333ull);
}

/* Their value. */
static inline uint64_t eight_value(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    v -= 0x3030303030303030ull;
    v = (v * 10) + (v >> 8);
    v = (((v & 0x000000FF000000FFull) * 0x000F424000000064ull) +
         (((v >> 16) & 0x000000FF000000FFull) * 0x0000271000000001ull)) >> 32;
    return v;
}

#define DIGIT(c) ((unsigned)(c) - '0' <= 9u)

/* A valid JSON number token [tok, end) the fast ways cannot take: strtod, which stops at the
 * ',', ']' or whitespace after it. 0 if it stops elsewhere (a locale whose decimal point is not
 * '.') or the number is beyond float64. */
static __attribute__((noinline)) int slow_number(const unsigned char *tok, const unsigned char *end, double *dv) {
    char *stop = NULL;
    *dv = strtod((const char *)tok, &stop);
    /* Beyond float64 (strtod says inf): left to the caller's other reader, as simdjson leaves it. */
    return (const unsigned char *)stop == end && *dv - *dv == 0;
}

/* One token at *pp (before e), moving *pp past it. Integer grammar: *is_int = 1, *iv its value
 * (fails beyond int64); otherwise *dv. Returns 0 when the token is not a JSON number. */
static inline __attribute__((always_inline)) int number(const unsigned char **pp, const unsigned char *e,
                                                        int *is_int, int64_t *iv, double *dv) {
    const unsigned char *p = *pp, *const tok = p;
    const int neg = p < e && *p == '-';
    p += neg;
    if (p >= e || !DIGIT(*p)) return 0;
    uint64_t w = 0; /* the significant digits, while there are at most 19 */
    int nd = 0;     /* how many significant digits */
    if (*p == '0') {
        ++p;
        if (p < e && DIGIT(*p)) return 0; /* a leading zero */
    } else {
        const unsigned char *d0 = p;
        while (p < e && DIGIT(*p)) w = w * 10 + (unsigned)(*p++ - '0');
        nd = (int)(p - d0);
    }
    int frac = 0, is_float = 0;
    if (p < e && *p == '.') {
        is_float = 1;
        const unsigned char *f = ++p;
        if (w == 0 && nd == 0)
            while (p < e && *p == '0') ++p; /* 0.000ddd: these zeros are not significant */
        const unsigned char *s0 = p;
        while (p + 8 <= e && eight_digits(p)) {
            w = w * 100000000ull + eight_value(p);
            p += 8;
        }
        while (p < e && DIGIT(*p)) w = w * 10 + (unsigned)(*p++ - '0');
        if (p == f) return 0; /* no digit after the point */
        frac = (int)(p - f);
        nd += (int)(p - s0);
    }
    long long x = 0;
    if (p < e && (*p | 0x20) == 'e') {
        is_float = 1;
        ++p;
        int xneg = 0;
        if (p < e && (*p == '+' || *p == '-')) xneg = *p++ == '-';
        if (p >= e || !DIGIT(*p)) return 0;
        while (p < e && DIGIT(*p)) {
            if (x < 100000000) x = x * 10 + (*p - '0');
            ++p;
        }
        if (xneg) x = -x;
    }
    *pp = p;
    *is_int = !is_float;
    if (!is_float) {
        if (nd > 19 || (neg ? w > (1ull << 63) : w > (uint64_t)INT64_MAX)) return 0; /* beyond int64 */
        *iv = neg ? (int64_t)(0 - w) : (int64_t)w;
        return 1;
    }
    if (nd > 19 || x <= -1000 || x >= 1000) return slow_number(tok, p, dv);
    if (w == 0) {
        *dv = neg ? -0.0 : 0.0;
        return 1;
    }
    const int q = (int)x - frac;
    double d;
    if (w <= (1ull << 53) && q >= -22 && q <= 22)
        d = q < 0 ? (double)w / EXACT_POW10[-q] : (double)w * EXACT_POW10[q];
    else if (!from_pow5(w, q, &d))
        return slow_number(tok, p, dv);
    *dv = neg ? -d : d;
    return 1;
}

/* ---------------------------------------------------------------- one list */

typedef struct {
    const unsigned char *open, *close; /* at "[" and at its "]" */
    int kind;
    Py_ssize_t n;
    void *data; /* malloc'd; owned by the job until handed to a Buffer */
    int ok;
} list_t;

static int space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void read_list(list_t *L) {
    const unsigned char *p = L->open + 1, *e = L->close;
    L->ok = 0;
    while (p < e && space(*p)) ++p;
    if (p == e) {
        L->kind = K_EMPTY;
        L->n = 0;
        L->data = malloc(1);
        L->ok = L->data != NULL;
        return;
    }
    Py_ssize_t n = 1;
    for (const unsigned char *c = p; c < e; ++c) n += *c == ',';
    if (*p == 't' || *p == 'f') {
        unsigned char *out = malloc((size_t)n);
        if (!out) return;
        for (Py_ssize_t i = 0; i < n; ++i) {
            while (p < e && space(*p)) ++p;
            if (e - p >= 4 && memcmp(p, "true", 4) == 0) {
                out[i] = 1;
                p += 4;
            } else if (e - p >= 5 && memcmp(p, "false", 5) == 0) {
                out[i] = 0;
                p += 5;
            } else {
                free(out);
                return;
            }
            while (p < e && space(*p)) ++p;
            if (i + 1 < n ? (p >= e || *p++ != ',') : p != e) {
                free(out);
                return;
            }
        }
        L->kind = K_BOOL;
        L->n = n;
        L->data = out;
        L->ok = 1;
        return;
    }
    int64_t *out = malloc((size_t)n * 8);
    if (!out) return;
    int kind = K_INT, nulls = 0;
    for (Py_ssize_t i = 0; i < n; ++i) {
        while (p < e && space(*p)) ++p;
        int is_int;
        int64_t iv;
        double dv;
        if (e - p >= 4 && memcmp(p, "null", 4) == 0) { /* NaN, and the list floats with nulls */
            p += 4;
            is_int = 0;
            dv = NAN;
            nulls = 1;
        } else if (!number(&p, e, &is_int, &iv, &dv)) {
            free(out);
            return;
        }
        if (is_int) {
            if (kind == K_INT)
                out[i] = iv;
            else
                dv = (double)iv;
        } else if (kind == K_INT) { /* the first float: the integers before it become floats */
            kind = K_FLOAT;
            for (Py_ssize_t j = 0; j < i; ++j) {
                const double d = (double)out[j];
                memcpy(&out[j], &d, 8);
            }
        }
        if (kind == K_FLOAT) memcpy(&out[i], &dv, 8);
        while (p < e && space(*p)) ++p;
        if (i + 1 < n ? (p >= e || *p++ != ',') : p != e) {
            free(out);
            return;
        }
    }
    L->kind = nulls ? K_NULLS : kind;
    L->n = n;
    L->data = out;
    L->ok = 1;
}

/* ---------------------------------------------------------------- threads */

typedef struct {
    list_t *lists;
    Py_ssize_t count;
    Py_ssize_t next; /* taken with an atomic add */
} work_t;

static void *worker(void *arg) {
    work_t *w = arg;
    for (;;) {
        const Py_ssize_t i = __atomic_fetch_add(&w->next, 1, __ATOMIC_RELAXED);
        if (i >= w->count) return NULL;
        read_list(&w->lists[i]);
    }
}

/* ---------------------------------------------------------------- Buffer: malloc'd bytes */

typedef struct {
    PyObject_HEAD void *data;
    Py_ssize_t size;
} Buffer;

static void buffer_dealloc(Buffer *self) {
    free(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int buffer_get(Buffer *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->size, 0, flags);
}

static PyBufferProcs buffer_procs = {(getbufferproc)buffer_get, NULL};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "app.ingest._numbers.Buffer",
    .tp_basicsize = sizeof(Buffer),
    .tp_dealloc = (destructor)buffer_dealloc,
    .tp_as_buffer = &buffer_procs,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The values of one list (read_lists), as a buffer numpy.frombuffer reads.",
};

/* ---------------------------------------------------------------- read_lists */

static void free_lists(list_t *lists, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; ++i) free(lists[i].data);
    free(lists);
}

static PyObject *read_lists(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, stop;
    int threads;
    if (!PyArg_ParseTuple(args, "y*nni", &view, &start, &stop, &threads)) return NULL;
    if (start < 0 || stop > view.len || start > stop) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "start and stop must lie within the buffer");
        return NULL;
    }
    const unsigned char *base = view.buf, *end = base + stop;
    list_t *lists = NULL;
    Py_ssize_t count = 0, cap = 0;
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    const unsigned char *p = base + start;
    for (;;) {
        const unsigned char *o = memchr(p, '[', (size_t)(end - p));
        if (!o) break;
        const unsigned char *c = memchr(o + 1, ']', (size_t)(end - o - 1));
        if (!c) {
            ok = 0;
            break;
        }
        if (count == cap) {
            cap = cap ? cap * 2 : 32;
            list_t *grown = realloc(lists, (size_t)cap * sizeof *lists);
            if (!grown) {
                ok = 0;
                break;
            }
            lists = grown;
        }
        lists[count++] = (list_t){o, c, 0, 0, NULL, 0};
        p = c + 1;
    }
    if (ok && count) {
        work_t work = {lists, count, 0};
        if (threads < 1) threads = 1;
        if (threads > MAX_THREADS) threads = MAX_THREADS;
        if (threads > count) threads = (int)count;
        pthread_t tids[MAX_THREADS];
        int started[MAX_THREADS] = {0};
        for (int i = 1; i < threads; ++i) started[i] = pthread_create(&tids[i], NULL, worker, &work) == 0;
        worker(&work);
        for (int i = 1; i < threads; ++i)
            if (started[i]) pthread_join(tids[i], NULL);
        for (Py_ssize_t i = 0; i < count; ++i) ok &= lists[i].ok;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (!ok) {
        free_lists(lists, count);
        Py_RETURN_NONE;
    }
    PyObject *out = PyList_New(count);
    if (!out) {
        free_lists(lists, count);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; ++i) {
        list_t *L = &lists[i];
        Buffer *buf = PyObject_New(Buffer, &BufferType);
        if (!buf) {
            Py_DECREF(out);
            free_lists(lists, count);
            return NULL;
        }
        buf->data = L->data;
        buf->size = L->kind == K_BOOL ? L->n : L->n * 8;
        L->data = NULL; /* the Buffer owns it now */
        PyObject *item = Py_BuildValue("(nniN)", (Py_ssize_t)(L->open - base), (Py_ssize_t)(L->close - base),
                                       L->kind, (PyObject *)buf);
        if (!item) {
            Py_DECREF(out);
            free_lists(lists, count);
            return NULL;
        }
        PyList_SET_ITEM(out, i, item);
    }
    free_lists(lists, count);
    return out;
}

static PyObject *read_number(PyObject *self, PyObject *args) {
    /* One number token (tests): (is_int, value) or None when it is not a JSON number. */
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    /* A copy with a terminator after the token, as in a list. */
    unsigned char *copy = malloc((size_t)view.len + 1);
    if (!copy) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    memcpy(copy, view.buf, (size_t)view.len);
    copy[view.len] = ']';
    const unsigned char *p = copy;
    int is_int;
    int64_t iv;
    double dv;
    const int ok = number(&p, copy + view.len, &is_int, &iv, &dv) && p == copy + view.len;
    free(copy);
    PyBuffer_Release(&view);
    if (!ok) Py_RETURN_NONE;
    return is_int ? Py_BuildValue("(OL)", Py_True, (long long)iv) : Py_BuildValue("(Od)", Py_False, dv);
}

static PyMethodDef methods[] = {
    {"read_lists", read_lists, METH_VARARGS,
     "read_lists(buffer, start, stop, threads) -> [(open, close, kind, data)] or None"},
    {"read_number", read_number, METH_VARARGS, "read_number(token) -> (is_int, value) or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_numbers", NULL, -1, methods};

PyMODINIT_FUNC PyInit__numbers(void) {
    if (PyType_Ready(&BufferType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyModule_AddIntConstant(m, "INT", K_INT);
    PyModule_AddIntConstant(m, "FLOAT", K_FLOAT);
    PyModule_AddIntConstant(m, "BOOL", K_BOOL);
    PyModule_AddIntConstant(m, "EMPTY", K_EMPTY);
    PyModule_AddIntConstant(m, "NULLS", K_NULLS);
    return m;
}
