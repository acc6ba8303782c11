/* The compiled passes of estimators/native.py: masked token-level and turn-level GAE (first,
 * estimators.token.gae / turn_gae), then the trainers' dialects' passes (SkyRL's span GAE with its
 * whitening, the row broadcast, row counts, masked returns, verl's optimal token baselines), each
 * with its own comment below.
 *
 * One fused pass for masked token-level and turn-level GAE:
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
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

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

/* The threads a kernel runs on: at least 1, at most MAX_THREADS and at most one per row. */
static int thread_count(int threads, long long B) {
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if ((long long)threads > B) threads = B > 0 ? (int)B : 1;
    return threads;
}

/* Run fn over jobs[0 .. threads) (each `size` bytes apart): job 0 on the calling thread, the others
 * on threads of their own, or here when a thread cannot start. Call with the GIL released. */
static void run_jobs(void *(*fn)(void *), void *jobs, size_t size, int threads) {
    pthread_t tids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    char *at = (char *)jobs;
    for (int i = 1; i < threads; ++i) started[i] = pthread_create(&tids[i], NULL, fn, at + i * size) == 0;
    fn(at);
    for (int i = 1; i < threads; ++i) {
        if (started[i])
            pthread_join(tids[i], NULL);
        else
            fn(at + i * size); /* could not start a thread: do its rows here */
    }
}

static PyObject *run(int turns, unsigned long long r, unsigned long long v, unsigned long long m,
                     unsigned long long ids, unsigned long long lv, unsigned long long adv,
                     unsigned long long tgt, long long B, long long T, double gamma, double lam,
                     int vk, int mk, int threads) {
    if (B < 0 || T < 0 || vk < V_F32 || vk > V_F64 || mk < M_I64 || mk > M_F64) {
        PyErr_SetString(PyExc_ValueError, "bad shape or dtype code");
        return NULL;
    }
    threads = thread_count(threads, B);
    job_t jobs[MAX_THREADS];
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < threads; ++i) {
        jobs[i] = (job_t){(const void *)(uintptr_t)r, (const void *)(uintptr_t)v,
                          (const void *)(uintptr_t)m, (const double *)(uintptr_t)lv,
                          (const int64_t *)(uintptr_t)ids, turns,
                          (void *)(uintptr_t)adv, (void *)(uintptr_t)tgt, T,
                          B * i / threads, B * (i + 1) / threads, gamma, gamma * lam, vk, mk};
    }
    run_jobs(gae_job, jobs, sizeof jobs[0], threads);
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

/* ---- GAE / discounted returns over the response span, whitened (SkyRL 0.3.0's semantics) ----
 *
 * SkyRL's recursion ignores every mask inside the response: each token of a row's response span
 * (its first to last policy token) takes one step, tool tokens included, reading the value and
 * reward there; after the span V = 0 and nothing is bootstrapped:
 *
 *   delta = (r[t] - V[t]) + gamma * V_next;  A = delta + gamma * lam * A;  V_next = V[t]
 *
 * (REINFORCE++: V = 0 and lam = 1, so A is the discounted return.) The advantages are then
 * whitened over the span (masked_whiten with the span as mask, unbiased). Phase 1 walks each row
 * once, writing A (rounded to the storage type) and A + V on policy tokens, 0 elsewhere, and
 * summing the rounded A and its square over the span in double; it records the row's runs of
 * policy tokens. Phase 2 whitens those runs alone: (A - mean) * rsqrt(var + 1e-8) in the storage
 * type, var = (sum A^2 / N - mean^2) * N/(N-1) with N/(N-1) in float32 as the trainers' integer
 * mask gives it. Rows are walked two at a time in lockstep: two independent recursions hide the
 * latency of one (the step is a dependent multiply and add).
 *
 * Rewards are float32 (SkyRL's reward tensor); values and outputs float32 or float64 alike;
 * values NULL for returns. The mask as for gae above.
 */

typedef struct {
    int64_t off, len; /* one run of policy tokens: element offset in [B, T], length */
} run_t;

typedef struct {
    const float *r;
    const void *v, *m;
    void *adv, *tgt;
    int64_t T, row0, row1;
    double g, c;
    int vk, mk;
    /* phase 1 out */
    double sum, sumsq;
    int64_t n;
    run_t *runs;
    int64_t nruns, cap;
    int oom;
    /* phase 2 in */
    double mean, rs;
} span_job_t;

static int push_run(span_job_t *j, int64_t off, int64_t len) {
    if (j->nruns == j->cap) {
        int64_t cap = j->cap ? 2 * j->cap : 1024;
        run_t *p = (run_t *)realloc(j->runs, (size_t)cap * sizeof(run_t));
        if (!p) {
            j->oom = 1;
            return 0;
        }
        j->runs = p;
        j->cap = cap;
    }
    j->runs[j->nruns++] = (run_t){off, len};
    return 1;
}

/* Row i's state: pointers, span [lo, hi], recursion, sums, the policy run being walked. */
#define SPAN_STATE(VT, MT, i)                                                       \
    const float *r##i = NULL;                                                        \
    const VT *v##i = NULL;                                                           \
    const MT *m##i = NULL;                                                           \
    VT *adv##i = NULL, *tgt##i = NULL;                                               \
    int64_t lo##i = 0, hi##i = -1, end##i = -1, base##i = 0;                         \
    double A##i = 0.0, vn##i = 0.0, s##i = 0.0, q##i = 0.0;

/* Point row i at row b; zero the outputs outside its span; hi < lo for a row without policy. */
#define SPAN_OPEN(VT, MT, i, b)                                                      \
    {                                                                                \
        base##i = (b) * T;                                                           \
        r##i = j->r + base##i;                                                       \
        v##i = HASV ? (const VT *)j->v + base##i : NULL;                             \
        m##i = (const MT *)j->m + base##i;                                           \
        adv##i = (VT *)j->adv + base##i;                                             \
        tgt##i = (VT *)j->tgt + base##i;                                             \
        hi##i = T - 1;                                                               \
        while (hi##i >= 0 && m##i[hi##i] == 0) --hi##i;                              \
        lo##i = 0;                                                                   \
        while (lo##i <= hi##i && m##i[lo##i] == 0) ++lo##i;                          \
        for (int64_t u = hi##i + 1; u < T; ++u) adv##i[u] = tgt##i[u] = 0;           \
        for (int64_t u = 0; u < lo##i && u <= hi##i; ++u) adv##i[u] = tgt##i[u] = 0; \
        A##i = vn##i = s##i = q##i = 0.0;                                            \
        end##i = -1;                                                                 \
        j->n += hi##i >= lo##i ? hi##i - lo##i + 1 : 0;                              \
    }

/* One step of row i at column t. */
#define SPAN_STEP(VT, i, t)                                                          \
    {                                                                                \
        const double vt = HASV ? (double)v##i[t] : 0.0;                              \
        const double d = ((double)r##i[t] - vt) + g * vn##i;                         \
        A##i = CZ ? d : d + c * A##i;                                          \
        const VT a = (VT)A##i;                                                       \
        s##i += (double)a;                                                           \
        q##i += (double)a * (double)a;                                               \
        if (m##i[t] != 0) {                                                          \
            adv##i[t] = a;                                                           \
            tgt##i[t] = (VT)(A##i + vt);                                             \
            if (end##i < 0) end##i = (t);                                            \
        } else {                                                                     \
            adv##i[t] = 0;                                                           \
            tgt##i[t] = 0;                                                           \
            if (end##i >= 0) {                                                       \
                push_run(j, base##i + (t) + 1, end##i - (t));                        \
                end##i = -1;                                                         \
            }                                                                        \
        }                                                                            \
        vn##i = vt;                                                                  \
    }

/* Close row i: its last run (the span starts on a policy token) and its sums. */
#define SPAN_CLOSE(i)                                                                \
    {                                                                                \
        if (end##i >= 0) push_run(j, base##i + lo##i, end##i - lo##i + 1);           \
        j->sum += s##i;                                                              \
        j->sumsq += q##i;                                                            \
    }

#define SPAN_ROWS(VT, MT)                                                            \
    for (int64_t b = j->row0; b < j->row1; b += 2) {                                 \
        SPAN_STATE(VT, MT, 0)                                                        \
        SPAN_STATE(VT, MT, 1)                                                        \
        SPAN_OPEN(VT, MT, 0, b)                                                      \
        const int two = b + 1 < j->row1;                                             \
        if (two) SPAN_OPEN(VT, MT, 1, b + 1)                                         \
        const int64_t L0 = hi0 - lo0 + 1, L1 = two ? hi1 - lo1 + 1 : 0;              \
        const int64_t both = L0 < L1 ? L0 : L1;                                      \
        int64_t k = 0;                                                               \
        for (; k < both; ++k) {                                                      \
            const int64_t t0 = hi0 - k, t1 = hi1 - k;                                \
            SPAN_STEP(VT, 0, t0)                                                     \
            SPAN_STEP(VT, 1, t1)                                                     \
        }                                                                            \
        for (int64_t k0 = k; k0 < L0; ++k0) {                                        \
            const int64_t t0 = hi0 - k0;                                             \
            SPAN_STEP(VT, 0, t0)                                                     \
        }                                                                            \
        for (int64_t k1 = k; k1 < L1; ++k1) {                                        \
            const int64_t t1 = hi1 - k1;                                             \
            SPAN_STEP(VT, 1, t1)                                                     \
        }                                                                            \
        SPAN_CLOSE(0)                                                                \
        if (two) SPAN_CLOSE(1)                                                       \
    }

#define SPAN_BY_MASK(VT)                                                             \
    switch (j->mk) {                                                                 \
    case M_I64: SPAN_ROWS(VT, int64_t) break;                                        \
    case M_I32: SPAN_ROWS(VT, int32_t) break;                                        \
    case M_U8: SPAN_ROWS(VT, uint8_t) break;                                         \
    case M_F32: SPAN_ROWS(VT, float) break;                                          \
    default: SPAN_ROWS(VT, double) break;                                            \
    }

#define SPAN_PHASE1(HASV_)                                                           \
    {                                                                                \
        enum { HASV = HASV_ };                                                       \
        if (j->vk == V_F32) {                                                        \
            SPAN_BY_MASK(float)                                                      \
        } else {                                                                     \
            SPAN_BY_MASK(double)                                                     \
        }                                                                            \
    }

static void *span_phase1(void *arg) {
    span_job_t *j = (span_job_t *)arg;
    const int64_t T = j->T;
    const double g = j->g, c = j->c;
    /* c = 0 (lambda or gamma 0): A = delta, without the 0 * inf of an infinite A */
    if (c == 0.0) {
        enum { CZ = 1 };
        if (j->v) {
            SPAN_PHASE1(1)
        } else {
            SPAN_PHASE1(0)
        }
    } else {
        enum { CZ = 0 };
        if (j->v) {
            SPAN_PHASE1(1)
        } else {
            SPAN_PHASE1(0)
        }
    }
    return NULL;
}

#define SPAN_WHITEN(VT)                                                              \
    {                                                                                \
        VT *adv = (VT *)j->adv;                                                      \
        const VT mean = (VT)j->mean, rs = (VT)j->rs;                                 \
        for (int64_t k = 0; k < j->nruns; ++k) {                                     \
            VT *p = adv + j->runs[k].off;                                            \
            const int64_t len = j->runs[k].len;                                      \
            for (int64_t u = 0; u < len; ++u) p[u] = (p[u] - mean) * rs;             \
        }                                                                            \
    }

static void *span_phase2(void *arg) {
    span_job_t *j = (span_job_t *)arg;
    if (j->vk == V_F32)
        SPAN_WHITEN(float)
    else
        SPAN_WHITEN(double)
    return NULL;
}

static PyObject *native_span_gae(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long r, v, m, adv, tgt;
    long long B, T;
    double gamma, lam;
    int vk, mk, threads;
    if (!PyArg_ParseTuple(args, "KKKKKLLddiii", &r, &v, &m, &adv, &tgt, &B, &T, &gamma, &lam, &vk,
                          &mk, &threads))
        return NULL;
    if (B < 0 || T < 0 || vk < V_F32 || vk > V_F64 || mk < M_I64 || mk > M_F64) {
        PyErr_SetString(PyExc_ValueError, "bad shape or dtype code");
        return NULL;
    }
    threads = thread_count(threads, B);
    span_job_t jobs[MAX_THREADS];
    double sum = 0.0, sumsq = 0.0;
    int64_t n = 0;
    int oom = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < threads; ++i) {
        /* Rows in pairs: a thread's share starts on an even row. */
        int64_t a = (B * i / threads) & ~(int64_t)1, e = (B * (i + 1) / threads) & ~(int64_t)1;
        if (i == threads - 1) e = B;
        jobs[i] = (span_job_t){.r = (const float *)(uintptr_t)r, .v = (const void *)(uintptr_t)v,
                               .m = (const void *)(uintptr_t)m, .adv = (void *)(uintptr_t)adv,
                               .tgt = (void *)(uintptr_t)tgt, .T = T, .row0 = a, .row1 = e,
                               .g = gamma, .c = gamma * lam, .vk = vk, .mk = mk};
    }
    run_jobs(span_phase1, jobs, sizeof jobs[0], threads);
    for (int i = 0; i < threads; ++i) { /* in job order: the same sums for the same threads */
        sum += jobs[i].sum;
        sumsq += jobs[i].sumsq;
        n += jobs[i].n;
        oom |= jobs[i].oom;
    }
    if (!oom && n >= 2) {
        const double mean = sum / (double)n;
        const float bessel = (float)n / (float)(n - 1); /* int64 / int64 in torch: float32 */
        const double var = (sumsq / (double)n - mean * mean) * (double)bessel;
        double rs;
        if (vk == V_F32) {
            const float vf = (float)var + 1e-8f;
            rs = (double)(1.0f / sqrtf(vf));
        } else {
            rs = 1.0 / sqrt(var + 1e-8);
        }
        for (int i = 0; i < threads; ++i) {
            jobs[i].mean = mean;
            jobs[i].rs = rs;
        }
        run_jobs(span_phase2, jobs, sizeof jobs[0], threads);
    }
    for (int i = 0; i < threads; ++i) free(jobs[i].runs);
    Py_END_ALLOW_THREADS
    if (oom) return PyErr_NoMemory();
    return Py_BuildValue("L", (long long)n);
}

/* ---- one number per row onto the row's tokens: a[b] * mask[b, t] (the trainers' broadcast) ----
 *
 * ``adv.unsqueeze(-1) * mask`` in one pass: torch first converts an integer mask to the float
 * type (a pass and a [B, T] temporary), then multiplies. Here out[b, t] = a[b] * m[b, t] for a
 * numeric mask, in torch's promoted type (so a 0/1 mask gives a or a * 0: -0.0 for a negative a,
 * NaN for a NaN or infinite one, as the multiply does), and m ? a : 0 for a bool mask
 * (torch.where). */

typedef struct {
    const void *a, *m;
    void *out;
    int64_t T, row0, row1;
    int vk, mk, select;
} bc_job_t;

/* x86-64 with GCC and glibc (target_clones needs its ifunc): an AVX2 build of the pass beside the
 * baseline one, picked at load time. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__)
#define BC_TARGETS __attribute__((target_clones("avx2", "default")))
#else
#define BC_TARGETS
#endif

/* a * m in torch's promoted type: an integer mask converts to VT; a floating one multiplies in
 * double (exact for float * float) and rounds once to VT. */
#define BC_MUL(VT, MT, a, x) ((MT)0.5 == 0 ? (a) * (VT)(x) : (VT)((double)(a) * (double)(x)))

/* The 0/1 fast path is branch-free, so it vectorises: out = m ? a : a * 0, and any other mask
 * value is noticed (`other`) and its row redone with the multiply. */
#define BC_ROWS(VT, MT)                                                              \
    for (int64_t b = j->row0; b < j->row1; ++b) {                                    \
        const VT a = ((const VT *)j->a)[b];                                          \
        const MT *restrict m = (const MT *)j->m + b * T;                             \
        VT *restrict out = (VT *)j->out + b * T;                                     \
        if (j->select) {                                                             \
            for (int64_t t = 0; t < T; ++t) out[t] = m[t] != 0 ? a : (VT)0;          \
            continue;                                                                \
        }                                                                            \
        const VT z = a * (VT)0; /* -0.0 for a negative a, NaN for inf or NaN */      \
        int other = 0;                                                               \
        for (int64_t t = 0; t < T; ++t) {                                            \
            other |= (m[t] != 0) & (m[t] != 1);                                      \
            out[t] = m[t] != 0 ? a : z;                                              \
        }                                                                            \
        if (other)                                                                   \
            for (int64_t t = 0; t < T; ++t) out[t] = BC_MUL(VT, MT, a, m[t]);        \
    }

BC_TARGETS static void *bc_job(void *arg) {
    const bc_job_t *j = (const bc_job_t *)arg;
    const int64_t T = j->T;
    if (j->vk == V_F32) {
        BY_MASK(BC_ROWS, float)
    } else {
        BY_MASK(BC_ROWS, double)
    }
    return NULL;
}

static PyObject *native_row_broadcast(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long a, m, out;
    long long B, T;
    int vk, mk, select, threads;
    if (!PyArg_ParseTuple(args, "KKKLLiiii", &a, &m, &out, &B, &T, &vk, &mk, &select, &threads))
        return NULL;
    if (B < 0 || T < 0 || vk < V_F32 || vk > V_F64 || mk < M_I64 || mk > M_F64) {
        PyErr_SetString(PyExc_ValueError, "bad shape or dtype code");
        return NULL;
    }
    threads = thread_count(threads, B);
    bc_job_t jobs[MAX_THREADS];
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < threads; ++i)
        jobs[i] = (bc_job_t){(const void *)(uintptr_t)a, (const void *)(uintptr_t)m,
                             (void *)(uintptr_t)out, T, B * i / threads, B * (i + 1) / threads,
                             vk, mk, select};
    run_jobs(bc_job, jobs, sizeof jobs[0], threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ---- policy tokens per row: count of m != 0 (a vectorised pass over the mask) ---- */

#define COUNT_ROWS(VT, MT)                                                           \
    for (int64_t b = j->row0; b < j->row1; ++b) {                                    \
        const MT *restrict m = (const MT *)j->m + b * T;                             \
        int64_t n = 0;                                                               \
        for (int64_t t = 0; t < T; ++t) n += m[t] != 0;                              \
        ((int64_t *)j->out)[b] = n;                                                  \
    }

BC_TARGETS static void *count_job(void *arg) {
    const bc_job_t *j = (const bc_job_t *)arg;
    const int64_t T = j->T;
    BY_MASK(COUNT_ROWS, float)
    return NULL;
}

static PyObject *native_row_counts(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long m, out;
    long long B, T;
    int mk;
    if (!PyArg_ParseTuple(args, "KKLLi", &m, &out, &B, &T, &mk)) return NULL;
    if (B < 0 || T < 0 || mk < M_I64 || mk > M_F64) {
        PyErr_SetString(PyExc_ValueError, "bad shape or dtype code");
        return NULL;
    }
    bc_job_t job = {NULL, (const void *)(uintptr_t)m, (void *)(uintptr_t)out, T, 0, B, 0, mk, 0};
    Py_BEGIN_ALLOW_THREADS
    count_job(&job);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ---- discounted returns over the policy tokens, minus a per-row baseline ----
 *
 * The masked GAE above with V = 0 and lambda = 1, without reading a values array: on a policy
 * token G = r + gamma * G_next (the same double arithmetic: delta = (r - 0) + gamma * 0), other
 * tokens skipped (G carried, 0 written). ret[t] = G; with a baseline array, adv[t] = G - base[b]
 * in the storage type (ReMax), else no second output. */

typedef struct {
    const void *r, *m, *base;
    void *ret, *adv;
    int64_t T, row0, row1;
    double g;
    int vk, mk;
} ret_job_t;

#define RET_ROWS(VT, MT)                                                             \
    for (int64_t b = j->row0; b < j->row1; ++b) {                                    \
        const VT *r = (const VT *)j->r + b * T;                                      \
        const MT *m = (const MT *)j->m + b * T;                                      \
        VT *ret = (VT *)j->ret + b * T;                                              \
        VT *adv = j->adv ? (VT *)j->adv + b * T : NULL;                              \
        const VT sb = j->base ? ((const VT *)j->base)[b] : (VT)0;                    \
        double A = 0.0;                                                              \
        for (int64_t t = T - 1; t >= 0; --t) {                                       \
            if ((t & 7) == 0 && t >= PF) {                                           \
                __builtin_prefetch(&m[t - PF], 0, 0);                                \
                __builtin_prefetch(&r[t - PF], 0, 0);                                \
                __builtin_prefetch(&ret[t - PF], 1, 0);                              \
            }                                                                        \
            if (m[t] != 0) {                                                         \
                const double d = ((double)r[t] - 0.0) + g * 0.0;                     \
                A = c == 0.0 ? d : d + c * A;                                        \
                const VT gv = (VT)A;                                                 \
                ret[t] = gv;                                                         \
                if (adv) adv[t] = gv - sb;                                           \
            } else {                                                                 \
                ret[t] = 0;                                                          \
                if (adv) adv[t] = 0;                                                 \
            }                                                                        \
        }                                                                            \
    }

static void *ret_job(void *arg) {
    const ret_job_t *j = (const ret_job_t *)arg;
    const int64_t T = j->T;
    const double g = j->g, c = j->g;
    if (j->vk == V_F32) {
        BY_MASK(RET_ROWS, float)
    } else {
        BY_MASK(RET_ROWS, double)
    }
    return NULL;
}

static PyObject *native_masked_returns(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long r, m, base, ret, adv;
    long long B, T;
    double gamma;
    int vk, mk, threads;
    if (!PyArg_ParseTuple(args, "KKKKKLLdiii", &r, &m, &base, &ret, &adv, &B, &T, &gamma, &vk, &mk,
                          &threads))
        return NULL;
    if (B < 0 || T < 0 || vk < V_F32 || vk > V_F64 || mk < M_I64 || mk > M_F64) {
        PyErr_SetString(PyExc_ValueError, "bad shape or dtype code");
        return NULL;
    }
    threads = thread_count(threads, B);
    ret_job_t jobs[MAX_THREADS];
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < threads; ++i)
        jobs[i] = (ret_job_t){(const void *)(uintptr_t)r, (const void *)(uintptr_t)m,
                              (const void *)(uintptr_t)base, (void *)(uintptr_t)ret,
                              (void *)(uintptr_t)adv, T, B * i / threads, B * (i + 1) / threads,
                              gamma, vk, mk};
    run_jobs(ret_job, jobs, sizeof jobs[0], threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ---- verl's optimal token baselines (optimal_token_baseline, tir_optimal_token_baseline) ----
 *
 * What estimators/dialects/verl.py computes with a dozen [B, T] torch passes, in three passes
 * over each row with the same roundings (float/double as the storage type VT):
 *   1. backwards: G = undiscounted returns over policy tokens (as masked_returns), ret = G, 0 off
 *      the mask; forwards: W = cumsum of w = (1 - 2 e) + spp over policy tokens (the sum in
 *      double, as torch's cumsum), and for a member row, at column x (the token's column, or for
 *      the multi-turn one its ordinal among the row's policy tokens), num[g, x] += G * W and
 *      den[g, x] += W, rows in order (index_add_'s order);
 *   2. b[g, x] = num / (den + 1e-8);
 *   3. adv = (G - b) * m over every column (the column version: -0.0 and NaN as the multiply
 *      gives them), or G - b on policy tokens and 0 elsewhere (the ordinal version), with b = 0
 *      for rows whose use_b is 0 and from column/ordinal tail[b] on (the zero tail).
 * e = exp(logprobs) comes from torch (its vectorised exp rounds as the torch path's). Rows run on
 * one thread: the sums' order is the rows' order. */

/* Pass 1 of one row (returns backwards, then the forward cumulative weights into the group's
 * sums); also writes the row's policy flags to pol (read again by pass 3 instead of the mask). */
#define OTB_ROW(VT, MT)                                                              \
    {                                                                                \
        const VT *restrict r = (const VT *)r_ + b * T, *restrict e = (const VT *)e_ + b * T; \
        const VT *restrict spp = (const VT *)spp_ + b * T;                           \
        const MT *restrict m = (const MT *)m_ + b * T;                               \
        VT *restrict ret = (VT *)ret_ + b * T;                                       \
        uint8_t *restrict p = pol + b * T;                                           \
        for (int64_t t = 0; t < T; ++t) p[t] = m[t] != 0;                            \
        double A = 0.0;                                                              \
        for (int64_t t = T - 1; t >= 0; --t) {                                       \
            if (p[t]) {                                                              \
                const double d = ((double)r[t] - 0.0) + 1.0 * 0.0;                   \
                A = d + 1.0 * A;                                                     \
                ret[t] = (VT)A;                                                      \
            } else {                                                                 \
                ret[t] = 0;                                                          \
            }                                                                        \
        }                                                                            \
        if (member[b]) {                                                             \
            VT *restrict nr = (VT *)num_ + grp[b] * X, *restrict dr = (VT *)den_ + grp[b] * X; \
            double acc = 0.0; /* torch's cumsum: a double sum; off-policy terms are +0 */ \
            int64_t k = 0;                                                           \
            for (int64_t t = 0; t < T; ++t) {                                        \
                if (!p[t]) continue;                                                 \
                const VT two_e = (VT)2 * e[t];                                       \
                const VT w = ((VT)1 - two_e) + spp[t];                               \
                acc += (double)w;                                                    \
                const VT W = (VT)acc;                                                \
                const int64_t x = tir ? k++ : t;                                     \
                const VT gw = ret[t] * W;                                            \
                nr[x] += gw;                                                         \
                dr[x] += W;                                                          \
            }                                                                        \
        }                                                                            \
    }

/* Pass 3 of one row. */
#define OTB_OUT(VT)                                                                  \
    {                                                                                \
        const uint8_t *restrict p = pol + b * T;                                     \
        const VT *restrict ret = (const VT *)ret_ + b * T;                           \
        VT *restrict adv = (VT *)adv_ + b * T;                                       \
        const VT *restrict br = (const VT *)num_ + grp[b] * X;                       \
        const int64_t from = use_b[b] ? tail[b] : 0;                                 \
        if (tir) {                                                                   \
            int64_t k = 0;                                                           \
            for (int64_t t = 0; t < T; ++t) {                                        \
                if (p[t]) {                                                          \
                    adv[t] = ret[t] - (k < from ? br[k] : (VT)0);                    \
                    ++k;                                                             \
                } else {                                                             \
                    adv[t] = 0;                                                      \
                }                                                                    \
            }                                                                        \
        } else {                                                                     \
            const int64_t lim = from < T ? from : T;                                 \
            for (int64_t t = 0; t < lim; ++t) adv[t] = (ret[t] - br[t]) * (VT)p[t];  \
            for (int64_t t = lim; t < T; ++t) adv[t] = (ret[t] - (VT)0) * (VT)p[t];  \
        }                                                                            \
    }

#define OTB_PASS1(VT)                                                                \
    for (int64_t b = 0; b < B; ++b) {                                                \
        switch (mk) {                                                                \
        case M_I64: OTB_ROW(VT, int64_t) break;                                      \
        case M_I32: OTB_ROW(VT, int32_t) break;                                      \
        case M_U8: OTB_ROW(VT, uint8_t) break;                                       \
        case M_F32: OTB_ROW(VT, float) break;                                        \
        default: OTB_ROW(VT, double) break;                                          \
        }                                                                            \
    }

#define OTB_ALL(VT)                                                                  \
    {                                                                                \
        OTB_PASS1(VT)                                                                \
        VT *restrict num = (VT *)num_;                                               \
        const VT *restrict den = (const VT *)den_;                                   \
        for (int64_t i = 0; i < G * X; ++i) num[i] = num[i] / (den[i] + (VT)1e-8);   \
        for (int64_t b = 0; b < B; ++b) OTB_OUT(VT)                                  \
    }

BC_TARGETS static void otb_run(const void *r_, const void *m_, const void *e_, const void *spp_,
                               const int64_t *grp, const uint8_t *member, const uint8_t *use_b,
                               const int64_t *tail, void *ret_, void *adv_, void *num_, void *den_,
                               uint8_t *pol, int64_t B, int64_t T, int64_t G, int64_t X, int tir,
                               int vk, int mk) {
    if (vk == V_F32)
        OTB_ALL(float)
    else
        OTB_ALL(double)
}

static PyObject *native_otb(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long pr, pm, pe, pspp, pgrp, pmember, puse, ptail, pret, padv, pnum, pden;
    long long B, T, G, X;
    int tir, vk, mk;
    if (!PyArg_ParseTuple(args, "KKKKKKKKKKKKLLLLiii", &pr, &pm, &pe, &pspp, &pgrp, &pmember, &puse,
                          &ptail, &pret, &padv, &pnum, &pden, &B, &T, &G, &X, &tir, &vk, &mk))
        return NULL;
    if (B < 0 || T < 0 || G < 0 || X < 0 || vk < V_F32 || vk > V_F64 || mk < M_I64 || mk > M_F64) {
        PyErr_SetString(PyExc_ValueError, "bad shape or dtype code");
        return NULL;
    }
    const void *r_ = (const void *)(uintptr_t)pr, *m_ = (const void *)(uintptr_t)pm;
    const void *e_ = (const void *)(uintptr_t)pe, *spp_ = (const void *)(uintptr_t)pspp;
    const int64_t *grp = (const int64_t *)(uintptr_t)pgrp, *tail = (const int64_t *)(uintptr_t)ptail;
    const uint8_t *member = (const uint8_t *)(uintptr_t)pmember, *use_b = (const uint8_t *)(uintptr_t)puse;
    void *ret_ = (void *)(uintptr_t)pret, *adv_ = (void *)(uintptr_t)padv;
    void *num_ = (void *)(uintptr_t)pnum, *den_ = (void *)(uintptr_t)pden;
    uint8_t *pol = (uint8_t *)malloc(B * T > 0 ? (size_t)(B * T) : 1);
    if (!pol) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    otb_run(r_, m_, e_, spp_, grp, member, use_b, tail, ret_, adv_, num_, den_, pol, B, T, G, X, tir,
            vk, mk);
    Py_END_ALLOW_THREADS
    free(pol);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"gae", native_gae, METH_VARARGS,
     "gae(r, v, m, lv, adv, tgt, B, T, gamma, lam, vkind, mkind, threads): masked token-level "
     "GAE in one pass (addresses of contiguous buffers; see estimators/native.py)."},
    {"turn_gae", native_turn_gae, METH_VARARGS,
     "turn_gae(r, v, m, ids, lv, adv, tgt, B, T, gamma, lam, vkind, mkind, threads): turn-level "
     "GAE in one pass (ids = 0 for maximal runs of policy tokens)."},
    {"span_gae", native_span_gae, METH_VARARGS,
     "span_gae(r, v, m, adv, tgt, B, T, gamma, lam, vkind, mkind, threads) -> N: GAE (returns when "
     "v = 0) over each row's response span, whitened over the spans, on policy tokens (SkyRL)."},
    {"row_broadcast", native_row_broadcast, METH_VARARGS,
     "row_broadcast(a, m, out, B, T, vkind, mkind, select, threads): out[b, t] = a[b] * m[b, t] "
     "(select: m ? a : 0) in one pass."},
    {"row_counts", native_row_counts, METH_VARARGS,
     "row_counts(m, out, B, T, mkind): out[b] (int64) = number of m[b, t] != 0."},
    {"masked_returns", native_masked_returns, METH_VARARGS,
     "masked_returns(r, m, base, ret, adv, B, T, gamma, vkind, mkind, threads): discounted "
     "returns over policy tokens (no values read); adv = ret - base[b] when base and adv are given."},
    {"otb", native_otb, METH_VARARGS,
     "otb(r, m, e, spp, grp, member, use_b, tail, ret, adv, num, den, B, T, G, X, tir, vkind, "
     "mkind): verl's optimal token baselines (see estimators/dialects/verl.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_native", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
