/* exe_store.c: the adapter store (see exe_store.h). A flat array: an executor holds
 * tens to hundreds of adapters, and a linear scan costs nothing next to one cycle. */
#include "executor/exe_store.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const kind_names[STORE_NKINDS] = {"training slot", "sampler snapshot", "cached checkpoint"};

void exe_store_init(exe_store *s, const be_backend *be, void *ctx, size_t budget) {
    memset(s, 0, sizeof *s);
    s->be = be;
    s->ctx = ctx;
    s->budget = budget;
}

void exe_store_free(exe_store *s) {
    for (int i = 0; i < s->n; i++) s->be->adapter_free(s->ctx, s->e[i].ad);
    free(s->e);
    s->e = NULL;
    s->n = s->cap = 0;
    s->used = 0;
}

static int find(const exe_store *s, store_kind kind, const char *key) {
    for (int i = 0; i < s->n; i++)
        if (s->e[i].kind == kind && !strcmp(s->e[i].key, key)) return i;
    return -1;
}

/* Frees entry i (the last entry takes its place). */
static void remove_at(exe_store *s, int i) {
    s->used -= s->e[i].ad->device_bytes;
    s->be->adapter_free(s->ctx, s->e[i].ad);
    s->e[i] = s->e[--s->n];
}

be_adapter *exe_store_get(exe_store *s, store_kind kind, const char *key) {
    int i = find(s, kind, key);
    if (i < 0) return NULL;
    s->e[i].last_use = ++s->clock;
    s->e[i].used_at = clock_mono_s();
    return s->e[i].ad;
}

be_adapter *exe_store_peek(const exe_store *s, store_kind kind, const char *key) {
    int i = find(s, kind, key);
    return i < 0 ? NULL : s->e[i].ad;
}

be_adapter *exe_store_acquire(exe_store *s, store_kind kind, const char *key) {
    int i = find(s, kind, key);
    if (i < 0) return NULL;
    s->e[i].last_use = ++s->clock;
    s->e[i].used_at = clock_mono_s();
    s->e[i].pins++;
    return s->e[i].ad;
}


/* Evicts least recently used snapshots and checkpoints, unpinned and other than keep,
 * until `need` more bytes fit the budget. false if they cannot make enough room. */
static bool make_room(exe_store *s, size_t need, const be_adapter *keep) {
    while (s->used + need > s->budget) {
        int lru = -1;
        for (int i = 0; i < s->n; i++) {
            const store_entry *e = &s->e[i];
            if (e->kind == STORE_TRAINING || e->pins || e->ad == keep) continue;
            if (lru < 0 || e->last_use < s->e[lru].last_use) lru = i;
        }
        if (lru < 0) return false;
        log_info("adapter store: %s %s evicted (least recently used; %zu of %zu bytes in use)",
                 kind_names[s->e[lru].kind], s->e[lru].key, s->used, s->budget);
        remove_at(s, lru);
    }
    return true;
}

/* Pinned adapters may have taken the store over its budget: once released, the least
 * recently used of them go. */
void exe_store_release(exe_store *s, be_adapter *ad) {
    for (int i = 0; i < s->n; i++)
        if (s->e[i].ad == ad && s->e[i].pins > 0) {
            s->e[i].pins--;
            break;
        }
    make_room(s, 0, NULL);
}

int exe_store_put(exe_store *s, store_kind kind, const char *key, be_adapter *ad, bool pinned, char *err,
                  size_t errlen) {
    if (strlen(key) >= sizeof s->e[0].key) {
        s->be->adapter_free(s->ctx, ad);
        err_set(err, errlen, "adapter store: key of %zu bytes is too long", strlen(key));
        return -1;
    }
    int old = find(s, kind, key);
    if (old >= 0) remove_at(s, old);
    if (!make_room(s, ad->device_bytes, ad))
        log_warn("adapter store: %s %s of %zu bytes takes the store over its budget (%zu of %zu bytes in use)",
                 kind_names[kind], key, ad->device_bytes, s->used, s->budget);
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        store_entry *e = realloc(s->e, cap * sizeof *e);
        if (!e) {
            s->be->adapter_free(s->ctx, ad);
            err_set(err, errlen, "adapter store: out of memory");
            return -1;
        }
        s->e = e;
        s->cap = cap;
    }
    store_entry *e = &s->e[s->n++];
    e->kind = kind;
    snprintf(e->key, sizeof e->key, "%s", key);
    e->ad = ad;
    e->pins = pinned ? 1 : 0;
    e->last_use = ++s->clock;
    e->used_at = clock_mono_s();
    e->seqs = (slot_seqs){.state_seq = -1, .base_seq = -1, .snap_seq = -1, .snap_step = 0};
    s->used += ad->device_bytes;
    return 0;
}

slot_seqs *exe_store_seqs(exe_store *s, const char *model_id) {
    int i = find(s, STORE_TRAINING, model_id);
    return i < 0 ? NULL : &s->e[i].seqs;
}

void exe_store_drop(exe_store *s, store_kind kind, const char *key) {
    int i = find(s, kind, key);
    if (i < 0) return;
    log_info("adapter store: %s %s freed (%zu bytes)", kind_names[kind], key, s->e[i].ad->device_bytes);
    remove_at(s, i);
}

void exe_store_get_stats(const exe_store *s, exe_store_stats *out) {
    memset(out, 0, sizeof *out);
    out->budget = s->budget;
    out->used = s->used;
    for (int i = 0; i < s->n; i++) out->count[s->e[i].kind]++;
}

int exe_store_idle_training(const exe_store *s, double idle_s, const char **keys, int cap) {
    double now = clock_mono_s();
    uint64_t taken = 0;   /* clock values taken so far: entries come out in last_use order */
    int n = 0;
    while (n < cap) {
        int best = -1;
        for (int i = 0; i < s->n; i++) {
            const store_entry *e = &s->e[i];
            if (e->kind != STORE_TRAINING || e->pins || now - e->used_at < idle_s || e->last_use <= taken) continue;
            if (best < 0 || e->last_use < s->e[best].last_use) best = i;
        }
        if (best < 0) break;
        taken = s->e[best].last_use;
        keys[n++] = s->e[best].key;
    }
    return n;
}

int exe_store_keys(const exe_store *s, store_kind kind, const char **keys, int cap) {
    int n = 0;
    for (int i = 0; i < s->n && n < cap; i++)
        if (s->e[i].kind == kind) keys[n++] = s->e[i].key;
    return n;
}
