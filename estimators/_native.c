/* One fused pass for masked token-level and turn-level GAE (estimators.token.gae / turn_gae).
 *
 * The vectorised torch path (compress the mask, scatter, chunked scan, gather) needs about a
 * dozen passes over [B, T]; this kernel reads rewards, values and mask once and writes the two
 * outputs once, walking each row backwards:
 *
 *   policy token t:  delta = (r[t] - V[t]) + gamma * V_next;  A = delta + gamma * lam * A;
 *                    adv[t] = A;  target[t] = A + V[t];  V_next = V[t]
 *   other tokens:    adv[t] = target[t] = 0  (A and V_next carried unchanged)
 *
 * Turn-level GAE walks each turn backwards too, summing its rewards, then takes one step of the
 * same recursion with the turn's value (at its first policy token) and writes A and A + V to the
 * turn's policy tokens (a second touch of data still in cache). A turn is a maximal run of policy
 * tokens, or, with turn ids, a run of policy tokens with equal ids (tool spans in between).
 *
 * V_next starts at the row's bootstrap value (last_value, 0 when terminated). The recursion
 * runs in double whatever the storage type. "Policy" is mask != 0, as in the torch path. Rows
 * are split over `threads` POSIX threads; the GIL is released while they run.
 *
 * The addresses come from torch tensors the caller keeps alive for the call: contiguous
 * [B, T] rewards/values/outputs (float32 or float64, all alike), a contiguous [B, T] mask
 * (int64, int32, uint8/bool, float32 or float64), an optional contiguous [B] double array of
 * bootstrap values and, for turns, an optional contiguous int64 [B, T] array of turn ids. estimators/native.py checks all of that before calling.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>

enum { V_F32 = 0, V_F64 = 1 };
#ifndef PF
#define PF 512 /* elements: prefetch this far ahead (rows are walked backwards) */
#endif
enum { M_I64 = 0, M_I32 = 1, M_U8 = 2, M_F32 = 3, M_F64 = 4 };

/* Hardware prefetchers follow descending streams poorly: with five streams per row, asking for
 * the data PF elements ahead brings a cold-cache pass from ~2x to ~1x the time of a memcpy. */
#define PREFETCH(t)                                                                  \
    if ((t) >= PF) {                                                                 \
        __builtin_prefetch(&m[(t) - PF], 0, 0);                                      \
        __builtin_prefetch(&r[(t) - PF], 0, 0);                                      \
        __builtin_prefetch(&v[(t) - PF], 0, 0);                                      \
        __builtin_prefetch(&adv[(t) - PF], 1, 0);                                    \
        __builtin_prefetch(&tgt[(t) - PF], 1, 0);                                    \
    }

typedef struct {
    const void *r, *v, *m;
    const double *lv;
    const int64_t *ids; /* turn ids or NULL */
    int turns;          /* 0: token-level, 1: turn-level */
    void *adv, *tgt;
    int64_t T, row0, row1;
    double gamma, c;
    int vk, mk;
} job_t;

#define GAE_ROWS(VT, MT)                                                             \
    for (int64_t b = j->row0; b < j->row1; ++b) {                                    \
        const VT *r = (const VT *)j->r + b * T, *v = (const VT *)j->v + b * T;       \
        const MT *m = (const MT *)j->m + b * T;                                      \
        VT *adv = (VT *)j->adv + b * T, *tgt = (VT *)j->tgt + b * T;                 \
        double A = 0.0, vn = j->lv ? j->lv[b] : 0.0;                                 \
        for (int64_t t = T - 1; t >= 0; --t) {                                       \
            PREFETCH(t)                                                              \
            if (m[t] != 0) {                                                         \
                const double vt = (double)v[t];                                      \
                const double d = ((double)r[t] - vt) + g * vn;                       \
                A = c == 0.0 ? d : d + c * A; /* no 0 * inf after an infinite delta */ \
                adv[t] = (VT)A;                                                      \
                tgt[t] = (VT)(A + vt);                                               \
                vn = vt;                                                             \
            } else {                                                                 \
                adv[t] = 0;                                                          \
                tgt[t] = 0;                                                          \
            }                                                                        \
        }                                                                            \
    }

/* One step of the recursion for the turn [first, end] (rewards summed in racc). */
#define TURN_STEP(VT)                                                                \
    {                                                                                \
        const double vk = (double)v[first];                                          \
        const double d = (racc - vk) + g * vn;                                       \
        A = c == 0.0 ? d : d + c * A;                                                \
        const VT a = (VT)A, tg = (VT)(A + vk);                                       \
        for (int64_t u = first; u <= end; ++u)                                       \
            if (m[u] != 0) {                                                         \
                adv[u] = a;                                                          \
                tgt[u] = tg;                                                         \
            }                                                                        \
        vn = vk;                                                                     \
    }

#define TURN_ROWS(VT, MT)                                                            \
    for (int64_t b = j->row0; b < j->row1; ++b) {                                    \
        const VT *r = (const VT *)j->r + b * T, *v = (const VT *)j->v + b * T;       \
        const MT *m = (const MT *)j->m + b * T;                                      \
        const int64_t *id = j->ids ? j->ids + b * T : NULL;                          \
        VT *adv = (VT *)j->adv + b * T, *tgt = (VT *)j->tgt + b * T;                 \
        double A = 0.0, vn = j->lv ? j->lv[b] : 0.0, racc = 0.0;                     \
        int64_t end = -1, first = -1; /* first = the last policy token seen */       \
        for (int64_t t = T - 1; t >= 0; --t) {                                       \
            PREFETCH(t)                                                              \
            if (m[t] == 0) {                                                         \
                adv[t] = 0;                                                          \
                tgt[t] = 0;                                                          \
                continue;                                                            \
            }                                                                        \
            const int same = first >= 0 && (id ? id[t] == id[first] : first == t + 1); \
            if (!same) {                                                             \
                if (first >= 0) TURN_STEP(VT)                                        \
                end = t;                                                             \
                racc = 0.0;                                                          \
            }                                                                        \
            racc += (double)r[t];                                                    \
            first = t;                                                               \
        }                                                                            \
        if (first >= 0) TURN_STEP(VT)                                                \
    }

/* ROWS(VT, MT) for the job's mask type. */
#define BY_MASK(ROWS, VT)                                                            \
    switch (j->mk) {                                                                 \
    case M_I64: ROWS(VT, int64_t) break;                                             \
    case M_I32: ROWS(VT, int32_t) break;                                             \
    case M_U8: ROWS(VT, uint8_t) break;                                              \
    case M_F32: ROWS(VT, float) break;                                               \
    default: ROWS(VT, double) break;                                                 \
    }

static void *gae_job(void *arg) {
    const job_t *j = (const job_t *)arg;
    const int64_t T = j->T;
    const double g = j->gamma, c = j->c;
    if (j->turns) {
        if (j->vk == V_F32) {
            BY_MASK(TURN_ROWS, float)
        } else {
            BY_MASK(TURN_ROWS, double)
        }
    } else if (j->vk == V_F32) {
        BY_MASK(GAE_ROWS, float)
    } else {
        BY_MASK(GAE_ROWS, double)
    }
    return NULL;
}

#define MAX_THREADS 64

static PyObject *run(int turns, unsigned long long r, unsigned long long v, unsigned long long m,
                     unsigned long long ids, unsigned long long lv, unsigned long long adv,
                     unsigned long long tgt, long long B, long long T, double gamma, double lam,
                     int vk, int mk, int threads) {
    if (B < 0 || T < 0 || vk < V_F32 || vk > V_F64 || mk < M_I64 || mk > M_F64) {
        PyErr_SetString(PyExc_ValueError, "bad shape or dtype code");
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
        jobs[i] = (job_t){(const void *)(uintptr_t)r, (const void *)(uintptr_t)v,
                          (const void *)(uintptr_t)m, (const double *)(uintptr_t)lv,
                          (const int64_t *)(uintptr_t)ids, turns,
                          (void *)(uintptr_t)adv, (void *)(uintptr_t)tgt, T,
                          B * i / threads, B * (i + 1) / threads, gamma, gamma * lam, vk, mk};
    }
    for (int i = 1; i < threads; ++i)
        started[i] = pthread_create(&tids[i], NULL, gae_job, &jobs[i]) == 0;
    gae_job(&jobs[0]);
    for (int i = 1; i < threads; ++i) {
        if (started[i])
            pthread_join(tids[i], NULL);
        else
            gae_job(&jobs[i]); /* could not start a thread: do its rows here */
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *native_gae(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long r, v, m, lv, adv, tgt;
    long long B, T;
    double gamma, lam;
    int vk, mk, threads;
    if (!PyArg_ParseTuple(args, "KKKKKKLLddiii", &r, &v, &m, &lv, &adv, &tgt, &B, &T, &gamma,
                          &lam, &vk, &mk, &threads))
        return NULL;
    return run(0, r, v, m, 0, lv, adv, tgt, B, T, gamma, lam, vk, mk, threads);
}

static PyObject *native_turn_gae(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long r, v, m, ids, lv, adv, tgt;
    long long B, T;
    double gamma, lam;
    int vk, mk, threads;
    if (!PyArg_ParseTuple(args, "KKKKKKKLLddiii", &r, &v, &m, &ids, &lv, &adv, &tgt, &B, &T,
                          &gamma, &lam, &vk, &mk, &threads))
        return NULL;
    return run(1, r, v, m, ids, lv, adv, tgt, B, T, gamma, lam, vk, mk, threads);
}

static PyMethodDef methods[] = {
    {"gae", native_gae, METH_VARARGS,
     "gae(r, v, m, lv, adv, tgt, B, T, gamma, lam, vkind, mkind, threads): masked token-level "
     "GAE in one pass (addresses of contiguous buffers; see estimators/native.py)."},
    {"turn_gae", native_turn_gae, METH_VARARGS,
     "turn_gae(r, v, m, ids, lv, adv, tgt, B, T, gamma, lam, vkind, mkind, threads): turn-level "
     "GAE in one pass (ids = 0 for maximal runs of policy tokens)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_native", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
