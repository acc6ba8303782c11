/* One pass for the per-token policy-loss weights of estimators.loss (vanilla, gpg, cispo).
 *
 * The torch path needs a dozen passes over [B, T] (differences, two exponentials, comparisons,
 * selections, products); this kernel reads advantages, log-probs, old and rollout log-probs and
 * the mask once and writes the weights (and, if asked, the state flags) once. Per token, with
 * d = lp - olp, r = exp(clamp(d, -20, 20)), s_b the row's aggregation factor, m the mask value:
 *
 *   vanilla:  g = A r, 0 when A > 0 and r > hi, A < 0 and r < lo, A < 0 and r > c, or |d| > 20
 *   gpg:      g = A
 *   cispo:    g = A clamp(r, lo, hi)
 *   rollout:  rho = exp(clamp(olp - rlp, -20, 20)) m per token, or the row's rho_b m;
 *             truncated at `upper` (TIS) or zeroed outside [lower, upper] (IcePop)
 *   w = s_b m rho g, 0 where m == 0
 *
 * The flags are estimators.loss.TokenState's. exp is a Cody-Waite reduction and a degree-13
 * polynomial (|error| < 2 ulp on [-45, 45], which is all it is asked for) so that the loop
 * vectorises; target_clones builds AVX-512 and AVX2 versions next to the baseline one.
 * Rows are split over `threads` POSIX threads; the GIL is released meanwhile. The addresses come
 * from contiguous torch tensors that estimators/loss.py checks and keeps alive for the call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

enum { L_VANILLA = 0, L_GPG = 1, L_CISPO = 2 };
enum { R_NONE = 0, R_TOKEN_TIS = 1, R_TOKEN_ICE = 2, R_SEQ_TIS = 3, R_SEQ_ICE = 4 };
enum { M_I64 = 0, M_U8 = 1, M_F64 = 2 };
enum { S_HIGH = 1, S_LOW = 2, S_DUAL = 4, S_TIS = 8, S_ICEPOP = 16, S_STABLE = 64 };

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

static inline __attribute__((always_inline)) double as_double(int64_t i) {
    double d;
    memcpy(&d, &i, sizeof d);
    return d;
}

static inline __attribute__((always_inline)) int64_t as_int(double d) {
    int64_t i;
    memcpy(&i, &d, sizeof i);
    return i;
}

/* exp(x) for |x| <= 45: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its Taylor polynomial. */
static inline __attribute__((always_inline)) double exp45(double x) {
    const double magic = 6755399441055744.0; /* 1.5 * 2^52: adding it rounds to an integer */
    const double t = x * 1.4426950408889634 + magic;
    const double n = t - magic;
    const double r = (x - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;
    double p = 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    return p * as_double((as_int(t) - as_int(magic) + 1023) << 52);
}

static inline __attribute__((always_inline)) double clampd(double x, double lo, double hi) {
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
}

typedef struct {
    const double *a, *lp, *olp, *rlp, *scale, *rowrho;
    const void *m;
    double *w;
    uint8_t *st;
    int64_t T, row0, row1;
    int loss, rollout, mk;
    double lo, hi, c, upper, lower;
} job_t;

/* One row, for compile-time LOSS and ROLL (so that each instance is one branch-free loop). */
#define ROW(MT, LOSS, ROLL)                                                                      \
    {                                                                                            \
        const MT *restrict m = (const MT *)j->m + o;                                             \
        /* Two loops: the ratio and its flags into w and st, then the rest (one loop with two   \
         * exponentials and every comparison does not vectorise). */                             \
        for (int64_t t = 0; t < T; ++t) {                                                        \
            const double A = a[t], d = lp[t] - olp[t];                                           \
            const double r = exp45(clampd(d, -20.0, 20.0));                                      \
            const int big = (d < -20.0) | (d > 20.0);                                            \
            const int pos = A > 0.0, neg = A < 0.0;                                              \
            const int high = LOSS == L_CISPO ? r > hi : pos & (r > hi);                          \
            const int lw = LOSS == L_CISPO ? r < lo : neg & (r < lo);                            \
            const int dual = (LOSS == L_VANILLA) & neg & (r > c);                                \
            int f = 0;                                                                           \
            if (LOSS != L_GPG) f = high * S_HIGH | lw * S_LOW;                                   \
            if (LOSS == L_VANILLA) f |= dual * S_DUAL | big * S_STABLE;                          \
            w[t] = r;                                                                            \
            st[t] = (uint8_t)f;                                                                  \
        }                                                                                        \
        for (int64_t t = 0; t < T; ++t) {                                                        \
            const double mv = (double)m[t], A = a[t], r = w[t];                                  \
            const int f0 = st[t];                                                                \
            const int cut = (LOSS == L_VANILLA) & (f0 != 0);                                     \
            const double g = LOSS == L_GPG ? A : (LOSS == L_CISPO ? A * clampd(r, lo, hi) : A * r); \
            const int tok = ROLL == R_TOKEN_TIS || ROLL == R_TOKEN_ICE;                          \
            const int ice = ROLL == R_TOKEN_ICE || ROLL == R_SEQ_ICE;                            \
            const double raw = (tok ? exp45(clampd(olp[t] - rlp[t], -20.0, 20.0)) : rowrho) * mv; \
            const int trunc = (ROLL != R_NONE) & !ice & (raw > up);                              \
            const int out = (ROLL != R_NONE) & ice & ((raw < low) | (raw > up));                 \
            const double rho = ROLL == R_NONE ? 1.0 : (ice ? (out ? 0.0 : raw) : (trunc ? up : raw)); \
            const double v = ((s * mv) * rho) * g;                                               \
            const int on = mv != 0.0;                                                            \
            w[t] = (on & !cut) ? v : 0.0;                                                        \
            st[t] = on ? (uint8_t)(f0 | trunc * S_TIS | out * S_ICEPOP) : 0;                     \
        }                                                                                        \
    }

#define BY_ROLL(MT, LOSS)                                                                        \
    switch (j->rollout) {                                                                        \
    case R_NONE: ROW(MT, LOSS, R_NONE) break;                                                    \
    case R_TOKEN_TIS: ROW(MT, LOSS, R_TOKEN_TIS) break;                                          \
    case R_TOKEN_ICE: ROW(MT, LOSS, R_TOKEN_ICE) break;                                          \
    case R_SEQ_TIS: ROW(MT, LOSS, R_SEQ_TIS) break;                                              \
    default: ROW(MT, LOSS, R_SEQ_ICE) break;                                                     \
    }

#define ROW_FN(MT)                                                                               \
    static CLONES void row_##MT(const job_t *j, int64_t b) {                                     \
        const int64_t T = j->T, o = b * T;                                                       \
        const double *restrict a = j->a + o, *restrict lp = j->lp + o;                           \
        const double *restrict olp = j->olp + o;                                                 \
        const double *restrict rlp = j->rlp ? j->rlp + o : j->olp + o;                           \
        double *restrict w = j->w + o;                                                           \
        uint8_t *restrict st = j->st + o; /* restrict: no alias checks, one vector loop */       \
        const double s = j->scale[b], rowrho = j->rowrho ? j->rowrho[b] : 1.0;                   \
        const double lo = j->lo, hi = j->hi, c = j->c, up = j->upper, low = j->lower;            \
        switch (j->loss) {                                                                       \
        case L_VANILLA: BY_ROLL(MT, L_VANILLA) break;                                            \
        case L_GPG: BY_ROLL(MT, L_GPG) break;                                                    \
        default: BY_ROLL(MT, L_CISPO) break;                                                     \
        }                                                                                        \
    }

typedef double f64;
ROW_FN(int64_t)
ROW_FN(uint8_t)
ROW_FN(f64)

static void *loss_job(void *arg) {
    const job_t *j = (const job_t *)arg;
    for (int64_t b = j->row0; b < j->row1; ++b) {
        switch (j->mk) {
        case M_I64: row_int64_t(j, b); break;
        case M_U8: row_uint8_t(j, b); break;
        default: row_f64(j, b); break;
        }
    }
    return NULL;
}

#define MAX_THREADS 64

static PyObject *native_loss_weights(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long a, lp, olp, rlp, m, scale, rowrho, w, st;
    long long B, T;
    int loss, rollout, mk, threads;
    double lo, hi, c, upper, lower;
    if (!PyArg_ParseTuple(args, "KKKKKKKKKLLiiidddddi", &a, &lp, &olp, &rlp, &m, &scale, &rowrho,
                          &w, &st, &B, &T, &loss, &rollout, &mk, &lo, &hi, &c, &upper, &lower,
                          &threads))
        return NULL;
    if (B < 0 || T < 0 || loss < L_VANILLA || loss > L_CISPO || rollout < R_NONE ||
        rollout > R_SEQ_ICE || mk < M_I64 || mk > M_F64 || st == 0) {
        PyErr_SetString(PyExc_ValueError, "bad shape, loss, rollout or mask code");
        return NULL;
    }
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if ((long long)threads > B) threads = B > 0 ? (int)B : 1;
    job_t jobs[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < threads; ++i) {
        jobs[i] = (job_t){(const double *)(uintptr_t)a, (const double *)(uintptr_t)lp,
                          (const double *)(uintptr_t)olp, (const double *)(uintptr_t)rlp,
                          (const double *)(uintptr_t)scale, (const double *)(uintptr_t)rowrho,
                          (const void *)(uintptr_t)m, (double *)(uintptr_t)w,
                          (uint8_t *)(uintptr_t)st, T, B * i / threads, B * (i + 1) / threads,
                          loss, rollout, mk, lo, hi, c, upper, lower};
    }
    for (int i = 1; i < threads; ++i)
        started[i] = pthread_create(&tids[i], NULL, loss_job, &jobs[i]) == 0;
    loss_job(&jobs[0]);
    for (int i = 1; i < threads; ++i) {
        if (started[i])
            pthread_join(tids[i], NULL);
        else
            loss_job(&jobs[i]); /* could not start a thread: do its rows here */
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* Each row's mask sum, in double (torch's reductions of a bool mask take ~10 passes' time). */
#define COUNT_ROWS(MT, ACC)                                                                      \
    static CLONES void count_##MT(const MT *restrict m, double *restrict out, int64_t B,         \
                                  int64_t T) {                                                   \
        for (int64_t b = 0; b < B; ++b) {                                                        \
            const MT *restrict row = m + b * T;                                                  \
            ACC acc = 0; /* integer masks sum in integers: that loop vectorises */               \
            for (int64_t t = 0; t < T; ++t) acc += (ACC)row[t];                                  \
            out[b] = (double)acc;                                                                \
        }                                                                                        \
    }
COUNT_ROWS(int64_t, int64_t)
COUNT_ROWS(uint8_t, int64_t)
COUNT_ROWS(f64, double)

static PyObject *native_row_counts(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long m, out;
    long long B, T;
    int mk;
    if (!PyArg_ParseTuple(args, "KKLLi", &m, &out, &B, &T, &mk)) return NULL;
    if (B < 0 || T < 0 || mk < M_I64 || mk > M_F64) {
        PyErr_SetString(PyExc_ValueError, "bad shape or mask code");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    switch (mk) {
    case M_I64: count_int64_t((const int64_t *)(uintptr_t)m, (double *)(uintptr_t)out, B, T); break;
    case M_U8: count_uint8_t((const uint8_t *)(uintptr_t)m, (double *)(uintptr_t)out, B, T); break;
    default: count_f64((const double *)(uintptr_t)m, (double *)(uintptr_t)out, B, T); break;
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"row_counts", native_row_counts, METH_VARARGS,
     "row_counts(m, out, B, T, mkind): each row's mask sum into a [B] double buffer."},
    {"loss_weights", native_loss_weights, METH_VARARGS,
     "loss_weights(a, lp, olp, rlp, m, scale, rowrho, w, st, B, T, loss, rollout, mkind, lo, hi, "
     "c, upper, lower, threads): per-token policy-loss weights in one pass (addresses of "
     "contiguous buffers; see estimators/loss.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_loss_native", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__loss_native(void) { return PyModule_Create(&module); }
