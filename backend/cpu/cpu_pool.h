/* cpu_pool.h — a fixed pool of worker threads running parallel-for loops. The caller's
 * thread takes part, so a pool of 1 is plain serial execution. Tasks are handed out by an
 * atomic counter, which balances uneven tasks (attention rows of different lengths).
 * defines: cpu_pool, cpu_pool_create, cpu_pool_run, cpu_pool_for */
#ifndef LOOM_BACKEND_CPU_POOL_H
#define LOOM_BACKEND_CPU_POOL_H

typedef struct cpu_pool cpu_pool;

/* fn(arg, task, thread): thread ∈ [0, cpu_pool_size) indexes per-thread scratch. */
typedef void (*cpu_task_fn)(void *arg, int task, int thread);
/* fn(arg, begin, end, thread) over a contiguous index range. */
typedef void (*cpu_range_fn)(void *arg, long begin, long end, int thread);

cpu_pool *cpu_pool_create(int nthreads); /* total threads, caller included; NULL on failure */
void cpu_pool_destroy(cpu_pool *p);
int cpu_pool_size(const cpu_pool *p);

/* Runs fn for task = 0..ntasks-1 and returns when all are done. Not reentrant: a task
 * must not call cpu_pool_run on the same pool. A NULL pool runs everything on the
 * caller's thread (as thread 0), here and in cpu_pool_for. */
void cpu_pool_run(cpu_pool *p, int ntasks, cpu_task_fn fn, void *arg);

/* Splits [0, n) into chunks of at least `grain` indices, about 4 per thread. */
void cpu_pool_for(cpu_pool *p, long n, long grain, cpu_range_fn fn, void *arg);

#endif
