/* OpenBLAS's parallel jobs on this extension's OpenMP threads (OpenBLAS >= 0.3.27 takes a
 * threading callback, openblas_set_threads_callback_function), so that one set of worker
 * threads serves both the GEMMs and the compiled passes between them.
 *
 * Why: with two pools, each core has two workers. After a GEMM, OpenBLAS's worker busy-waits
 * (OPENBLAS_THREAD_TIMEOUT) on the core the OpenMP worker of the next compiled pass needs, so that
 * pass's second half starts only when the spin ends: a 2-thread epilogue after a GEMM ran no
 * faster than on one thread (benchmarks/NOTES.md, session #10). On one pool the worker that
 * finished the GEMM's job is the one that takes the epilogue's.
 *
 * OpenBLAS's level-3 jobs wait on each other (a thread packs a panel, the others read it), so all
 * jobs of a call must run at once: an OpenMP team whose size is not the job count (inside a
 * parallel region, or under OMP_DYNAMIC) would deadlock, and then the jobs run on plain threads.
 * Job i uses OpenBLAS's per-thread buffer i, so job sets run one at a time (OpenBLAS's own
 * server serializes its threaded level-3 calls the same way). A forked child gets OpenBLAS's
 * own threads back, as before any of this.
 */
#include "native.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef void (*ow_dojob)(int thread_num, void *jobdata, int dojob_data);
typedef void (*ow_setter)(void *callback);

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static ow_setter installed;
static int64_t runs_team, runs_threads;

typedef struct {
    ow_dojob dojob;
    char *data;
    size_t size;
    int i, dd;
} ow_job;

static void *job_main(void *p) {
    ow_job *j = p;
    j->dojob(j->i, j->data + (size_t)j->i * j->size, j->dd);
    return NULL;
}

/* Jobs 1..n-1 on their own threads and job 0 here, all at once. A thread that cannot be
 * created ends the process with a message, as OpenBLAS's own server does: running fewer
 * threads than jobs could hang forever. */
static void run_on_threads(ow_dojob dojob, int n, size_t size, char *data, int dd) {
    pthread_t *tid = malloc(sizeof *tid * (size_t)n);
    ow_job *jobs = malloc(sizeof *jobs * (size_t)n);
    if (!tid || !jobs) {
        fprintf(stderr, "opwarden blas_pool: no memory for %d BLAS jobs\n", n);
        abort();
    }
    for (int i = 1; i < n; i++) {
        jobs[i] = (ow_job){dojob, data, size, i, dd};
        if (pthread_create(&tid[i], NULL, job_main, &jobs[i]) != 0) {
            fprintf(stderr, "opwarden blas_pool: pthread_create failed for BLAS job %d of %d\n",
                    i + 1, n);
            abort();
        }
    }
    dojob(0, data, dd);
    for (int i = 1; i < n; i++) pthread_join(tid[i], NULL);
    free(tid);
    free(jobs);
}

static void ow_blas_callback(int sync, ow_dojob dojob, int numjobs, size_t size, void *jobdata,
                             int dojob_data) {
    (void)sync; /* OpenBLAS waits for every job either way: all are done on return */
    char *data = jobdata;
    if (numjobs <= 1) {
        if (numjobs == 1) dojob(0, data, dojob_data);
        return;
    }
    pthread_mutex_lock(&pool_lock);
    int done = 0;
#ifdef _OPENMP
    if (!omp_in_parallel()) {
        int whole = 0;
#pragma omp parallel num_threads(numjobs)
        {
            if (omp_get_num_threads() == numjobs) {
                int i = omp_get_thread_num();
                if (i == 0) whole = 1;
                dojob(i, data + (size_t)i * size, dojob_data);
            }
        }
        done = whole;
    }
#endif
    if (done) {
        runs_team++;
    } else {
        run_on_threads(dojob, numjobs, size, data, dojob_data);
        runs_threads++;
    }
    pthread_mutex_unlock(&pool_lock);
}

static void before_fork(void) { pthread_mutex_lock(&pool_lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&pool_lock); }
static void after_fork_child(void) {
    pthread_mutex_unlock(&pool_lock);
    if (installed) installed(NULL);
}

int blas_pool_set(void *setter, int on) {
    static int atfork_done;
    if (!setter) return 0;
#ifndef _OPENMP
    if (on) return 0; /* no pool to lend */
#endif
    pthread_mutex_lock(&pool_lock); /* no job set in flight while the callback changes */
    if (!atfork_done) atfork_done = pthread_atfork(before_fork, after_fork_parent,
                                                   after_fork_child) == 0;
    ((ow_setter)setter)(on ? (void *)ow_blas_callback : NULL);
    installed = on ? (ow_setter)setter : NULL;
    pthread_mutex_unlock(&pool_lock);
    return 1;
}

void blas_pool_counts(int64_t *team, int64_t *threads) {
    pthread_mutex_lock(&pool_lock);
    *team = runs_team;
    *threads = runs_threads;
    pthread_mutex_unlock(&pool_lock);
}

void blas_pool_call_in_team(void (*fn)(int), int n) {
#ifdef _OPENMP
#pragma omp parallel num_threads(n)
    fn(omp_get_thread_num());
#else
    (void)n;
    fn(0);
#endif
}
