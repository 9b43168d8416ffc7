/* api_pool.h: the database workers. Each thread owns one PostgreSQL connection and runs
 * jobs to completion with synchronous libpq (auth, JSON parsing, the route's handler),
 * then sends the job back to its event loop through h2o_multithread. */
#pragma once
#include "common/keys.h"
#include "core/api_call.h"
#include "core/api_job.h"
#include <stddef.h>

typedef struct api_pool api_pool;

typedef struct {
    const char *conninfo;
    int nworkers;
    int max_queue;      /* jobs waiting beyond this are refused (503) */
    unsigned char secret[KEY_SECRET_BYTES];
    api_settings settings;
} api_pool_conf;

/* Connects every worker (waiting up to connect_wait_ms for the database) and starts them. */
api_pool *api_pool_start(const api_pool_conf *conf, int connect_wait_ms, char *err, size_t errlen);
/* The event loop's own look at a new request whose route has a first_look (api_route.h),
 * before any worker: when the request is small JSON, its key passed within the cache's
 * time (api_auth_key_cached) with the route's scope, the route's first_look answers it from
 * what the process holds in memory. 1: answered (the job holds its response, or park is
 * set: the loop parks it); 0: a worker takes the job as it came (nothing of the look kept).
 * Runs no statement: the loop thread has no connection. */
int api_pool_first_look(api_pool *p, api_job *job);
/* Queues a job. Returns -1 when the queue is full (the caller answers 503). Any thread. */
int api_pool_submit(api_pool *p, api_job *job);
