/* api_futures_cache.c: see api_futures_cache.h. */
#include "tinker/api_futures_cache.h"
#include "common/clock.h"
#include "common/strhash.h"
#include "core/api_job.h"
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A pending entry older than this is not believed (its loom_op_done was missed without a
 * reconnect, or the operation waits long in the queue: the row says which). A done entry
 * stays right for as long as it is kept: a result is final once committed. */
#define PENDING_S 30.0

typedef struct {
    char id[API_REQUEST_ID_MAX];
    int64_t tenant_id;
    fut_state state;
    double at;     /* clock_mono_s() */
    char *note;    /* FUT_DONE: the loom_op_done payload */
} slot;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static slot g_slots[FUT_SLOTS];

static slot *slot_of(const char *id, size_t len) { return &g_slots[str_hash(id, len) % FUT_SLOTS]; }

static void clear(slot *s) {
    free(s->note);
    memset(s, 0, sizeof *s);
}

void fut_cache_submitted(const char *request_id, int64_t tenant_id) {
    size_t len = strlen(request_id);
    if (len == 0 || len >= API_REQUEST_ID_MAX) return;
    pthread_mutex_lock(&g_mu);
    slot *s = slot_of(request_id, len);
    if (!(s->state == FUT_DONE && !strcmp(s->id, request_id))) {
        clear(s);
        memcpy(s->id, request_id, len + 1);
        s->tenant_id = tenant_id;
        s->state = FUT_PENDING;
        s->at = clock_mono_s();
    }
    pthread_mutex_unlock(&g_mu);
}

void fut_cache_noted(const char *payload, void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_mu);
    if (!payload) {
        for (int i = 0; i < FUT_SLOTS; i++) clear(&g_slots[i]);
        pthread_mutex_unlock(&g_mu);
        return;
    }
    /* "request_id\ttenant\tkind\t{B|J}..." carries the result; "request_id" alone does not */
    const char *t1 = strchr(payload, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL,
               *t3 = t2 ? strchr(t2 + 1, '\t') : NULL;
    size_t len = t1 ? (size_t)(t1 - payload) : strlen(payload);
    if (len == 0 || len >= API_REQUEST_ID_MAX) {
        pthread_mutex_unlock(&g_mu);
        return;
    }
    slot *s = slot_of(payload, len);
    bool same = !strncmp(s->id, payload, len) && s->id[len] == 0;
    if (t3 && (t3[1] == 'B' || t3[1] == 'J')) {
        char *note = strdup(payload);
        if (note) {
            clear(s);
            memcpy(s->id, payload, len);
            s->id[len] = 0;
            s->tenant_id = strtoll(t1 + 1, NULL, 10);
            s->state = FUT_DONE;
            s->at = clock_mono_s();
            s->note = note;
        } else if (same) {
            clear(s);
        }
    } else if (same) {
        clear(s);   /* finished without a result here: the row has it */
    }
    pthread_mutex_unlock(&g_mu);
}

fut_state fut_cache_get(const char *request_id, int64_t tenant_id, char **note) {
    size_t len = strlen(request_id);
    *note = NULL;
    if (len == 0 || len >= API_REQUEST_ID_MAX) return FUT_UNKNOWN;
    fut_state st = FUT_UNKNOWN;
    pthread_mutex_lock(&g_mu);
    slot *s = slot_of(request_id, len);
    if (s->state != FUT_UNKNOWN && s->tenant_id == tenant_id && !strcmp(s->id, request_id)) {
        if (s->state == FUT_DONE) {
            *note = strdup(s->note);
            if (*note) st = FUT_DONE;
        } else if (clock_mono_s() - s->at < PENDING_S) {
            st = FUT_PENDING;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return st;
}
