/* cpu_pool.c — pthread worker pool; see cpu_pool.h. */
#include "backend/cpu/cpu_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct cpu_pool {
    int n;                      /* threads including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    unsigned long generation;   /* bumped per job; workers wait for a change */
    int quit;
    /* the current job */
    cpu_task_fn fn;
    void *arg;
    int ntasks;
    atomic_int next;
    int busy;                   /* workers still inside the current job */
};

typedef struct {
    cpu_pool *p;
    int index;
} cpu_worker_arg;

static void cpu_pool_work(cpu_pool *p, int thread)
{
    for (;;) {
        int t = atomic_fetch_add(&p->next, 1);
        if (t >= p->ntasks) break;
        p->fn(p->arg, t, thread);
    }
}

static void *cpu_worker(void *va)
{
    cpu_worker_arg *wa = va;
    cpu_pool *p = wa->p;
    int index = wa->index;
    free(wa);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        cpu_pool_work(p, index);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

cpu_pool *cpu_pool_create(int nthreads)
{
    if (nthreads < 1) nthreads = 1;
    cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = calloc(nthreads, sizeof *p->threads);
    if (!p->threads) { free(p); return NULL; }
    for (int i = 1; i < nthreads; i++) {
        cpu_worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { p->n = i; break; }
        wa->p = p;
        wa->index = i;
        if (pthread_create(&p->threads[i], NULL, cpu_worker, wa) != 0) { free(wa); p->n = i; break; }
    }
    return p;
}

void cpu_pool_destroy(cpu_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int cpu_pool_size(const cpu_pool *p) { return p->n; }

void cpu_pool_run(cpu_pool *p, int ntasks, cpu_task_fn fn, void *arg)
{
    if (ntasks <= 0) return;
    if (!p || p->n == 1 || ntasks == 1) {
        for (int t = 0; t < ntasks; t++) fn(arg, t, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->ntasks = ntasks;
    atomic_store(&p->next, 0);
    p->busy = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    cpu_pool_work(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

typedef struct {
    cpu_range_fn fn;
    void *arg;
    long n, chunk;
} cpu_range_job;

static void cpu_range_task(void *va, int task, int thread)
{
    cpu_range_job *j = va;
    long b = (long)task * j->chunk, e = b + j->chunk < j->n ? b + j->chunk : j->n;
    j->fn(j->arg, b, e, thread);
}

void cpu_pool_for(cpu_pool *p, long n, long grain, cpu_range_fn fn, void *arg)
{
    if (n <= 0) return;
    if (!p) {
        fn(arg, 0, n, 0);
        return;
    }
    if (grain < 1) grain = 1;
    long chunk = (n + 4L * p->n - 1) / (4L * p->n);
    if (chunk < grain) chunk = grain;
    cpu_range_job j = {fn, arg, n, chunk};
    cpu_pool_run(p, (int)((n + chunk - 1) / chunk), cpu_range_task, &j);
}
