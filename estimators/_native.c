/* One fused pass for masked token-level GAE (estimators.token.gae).
 *
 * The vectorised torch path (compress the mask, scatter, chunked scan, gather) needs about a
 * dozen passes over [B, T]; this kernel reads rewards, values and mask once and writes the two
 * outputs once, walking each row backwards:
 *
 *   policy token t:  delta = (r[t] - V[t]) + gamma * V_next;  A = delta + gamma * lam * A;
 *                    adv[t] = A;  target[t] = A + V[t];  V_next = V[t]
 *   other tokens:    adv[t] = target[t] = 0  (A and V_next carried unchanged)
 *
 * V_next starts at the row's bootstrap value (last_value, 0 when terminated). The recursion
 * runs in double whatever the storage type. "Policy" is mask != 0, as in the torch path. Rows
 * are split over `threads` POSIX threads; the GIL is released while they run.
 *
 * The addresses come from torch tensors the caller keeps alive for the call: contiguous
 * [B, T] rewards/values/outputs (float32 or float64, all alike), a contiguous [B, T] mask
 * (int64, int32, uint8/bool, float32 or float64) and an optional contiguous [B] double array of
 * bootstrap values. estimators/native.py checks all of that before calling.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>

enum { V_F32 = 0, V_F64 = 1 };
enum { M_I64 = 0, M_I32 = 1, M_U8 = 2, M_F32 = 3, M_F64 = 4 };

typedef struct {
    const void *r, *v, *m;
    const double *lv;
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

#define GAE_MASKS(VT)                                                                \
    switch (j->mk) {                                                                 \
    case M_I64: GAE_ROWS(VT, int64_t) break;                                         \
    case M_I32: GAE_ROWS(VT, int32_t) break;                                         \
    case M_U8: GAE_ROWS(VT, uint8_t) break;                                          \
    case M_F32: GAE_ROWS(VT, float) break;                                           \
    default: GAE_ROWS(VT, double) break;                                             \
    }

static void *gae_job(void *arg) {
    const job_t *j = (const job_t *)arg;
    const int64_t T = j->T;
    const double g = j->gamma, c = j->c;
    if (j->vk == V_F32) {
        GAE_MASKS(float)
    } else {
        GAE_MASKS(double)
    }
    return NULL;
}

#define MAX_THREADS 64

static PyObject *native_gae(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long r, v, m, lv, adv, tgt;
    long long B, T;
    double gamma, lam;
    int vk, mk, threads;
    if (!PyArg_ParseTuple(args, "KKKKKKLLddiii", &r, &v, &m, &lv, &adv, &tgt, &B, &T, &gamma,
                          &lam, &vk, &mk, &threads))
        return NULL;
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

static PyMethodDef methods[] = {
    {"gae", native_gae, METH_VARARGS,
     "gae(r, v, m, lv, adv, tgt, B, T, gamma, lam, vkind, mkind, threads): masked token-level "
     "GAE in one pass (addresses of contiguous buffers; see estimators/native.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
