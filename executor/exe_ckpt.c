/* exe_ckpt.c: checkpoint operations against the registry: save_weights (weights + Adam
 * state), the named save_weights_for_sampler (weights only), load_weights, and the
 * loader of sampler adapters for the sampling code.
 *
 * A save serialises the adapter (model/adapter_io.c) and stores the blob before the cycle
 * commits; its commit hook then, inside the cycle's transaction, takes the digest's
 * shared lock (registry GC takes it exclusive), stores the blob again if GC removed it
 * meanwhile, and writes the adapter_versions row with its provenance. A name that
 * exists (overwrite false) fails the op with category user and writes nothing. */
#include "model/adapter_io.h"
#include "executor/exe_internal.h"
#include "registry/blobstore.h"
#include "registry/registry.h"
#include "common/log.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the commit hook needs; one malloc block (hook_data is released with free()). */
typedef struct {
    char kind[16];                 /* "training" | "sampler" */
    char name[REG_NAME_MAX + 1];
    char digest[BLOB_DIGEST_HEX];
    int64_t step, ttl_seconds, key_id;
    bool overwrite;
    size_t len;
    uint8_t bytes[];               /* the blob, to store again if GC took it */
} save_hook_data;

static int save_hook(PGconn *c, exe_state *st, exe_op *op, char *err, size_t errlen) {
    save_hook_data *h = op->hook_data;
    if (reg_blob_lock_shared(c, h->digest, err, errlen) < 0) return -1;
    if (!blob_exists(st->blobs, h->digest)) {
        char dg[BLOB_DIGEST_HEX];
        log_warn("checkpoint %s: blob %s vanished before commit (gc?); storing it again", h->name, h->digest);
        if (blob_put(st->blobs, h->bytes, h->len, dg, err, errlen) < 0) return -1;
    }
    reg_new_version v = {.model_id = op->model_id, .seq_id = op->seq_id, .kind = h->kind, .name = h->name,
                         .digest = h->digest, .size_bytes = (int64_t)h->len, .step = h->step,
                         .ttl_seconds = h->ttl_seconds, .overwrite = h->overwrite, .key_id = h->key_id};
    int64_t vid;
    char msg[512];
    int rc = reg_version_insert(c, &v, &vid, msg, sizeof msg);
    if (rc < 0) { snprintf(err, errlen, "recording the checkpoint failed: %s", msg); return -1; }
    /* Name taken: nothing was written; the op fails as the client's error. */
    if (rc == 1) exe_op_fail(op, "user", "%s", msg);
    else log_info("checkpoint %s/%s of %s: version %lld, step %lld, %zu bytes", h->kind, h->name, op->model_id,
                  (long long)vid, (long long)h->step, h->len);
    return 0;
}

static adapter *model_adapter(exe_state *st, exe_op *op) {
    adapter *ad = exe_slot_find(st, op->model_id);
    if (!ad)
        exe_op_fail(op, "server", "this model's training state is not on this executor (it was restarted); "
                    "load a checkpoint into a new model");
    return ad;
}

static void run_save(exe_state *st, exe_op *op, const char *kind) {
    json_t *p = op->payload;
    const char *name = json_string_value(json_object_get(p, "path"));
    char err[512];
    if (!name || !reg_name_valid(name, err, sizeof err)) {
        exe_op_fail(op, "user", "checkpoint name: %s", name ? err : "missing");
        return;
    }
    if (!st->blobs) {
        exe_op_fail(op, "server", "this executor has no registry blob store (start it with --blob-dir)");
        return;
    }
    adapter *ad = model_adapter(st, op);
    if (!ad) return;
    bool training = !strcmp(kind, "training");
    uint8_t *bytes;
    size_t len;
    if (adapter_io_encode(ad, training, &bytes, &len, err, sizeof err) < 0) {
        exe_op_fail(op, "server", "serialising the adapter failed: %s", err);
        return;
    }
    save_hook_data *h = malloc(sizeof *h + len);
    if (!h) {
        free(bytes);
        exe_op_fail(op, "server", "out of memory holding a %zu-byte checkpoint", len);
        return;
    }
    memset(h, 0, sizeof *h);
    if (blob_put(st->blobs, bytes, len, h->digest, err, sizeof err) < 0) {
        free(bytes);
        free(h);
        exe_op_fail(op, "server", "storing the checkpoint failed: %s", err);
        return;
    }
    snprintf(h->kind, sizeof h->kind, "%s", kind);
    snprintf(h->name, sizeof h->name, "%s", name);
    h->step = adapter_step(ad);
    json_t *ttl = json_object_get(p, "ttl_seconds");
    h->ttl_seconds = json_is_integer(ttl) ? json_integer_value(ttl) : -1;
    h->key_id = json_integer_value(json_object_get(p, "key_id"));
    h->overwrite = json_is_true(json_object_get(p, "overwrite"));
    h->len = len;
    memcpy(h->bytes, bytes, len);
    free(bytes);
    op->hook_data = h;
    op->commit_hook = save_hook;
    char path[REG_PATH_MAX];
    snprintf(path, sizeof path, "tinker://%s/%s/%s", op->model_id, reg_dir_of_kind(kind), name);
    op->result = json_pack("{s:s, s:s}", "path", path, "type", training ? "save_weights" : "save_weights_for_sampler");
}

static void run_save_weights(exe_state *st, exe_op *op) { run_save(st, op, "training"); }
static void run_save_sampler(exe_state *st, exe_op *op) { run_save(st, op, "sampler"); }

static void run_load_weights(exe_state *st, exe_op *op) {
    json_t *p = op->payload;
    const char *path = json_string_value(json_object_get(p, "path"));
    const char *digest = json_string_value(json_object_get(p, "blob_digest"));
    bool optimizer = json_is_true(json_object_get(p, "optimizer"));
    if (!path || !digest || !blob_digest_valid(digest)) {
        exe_op_fail(op, "server", "load_weights payload lacks the checkpoint's path or blob digest");
        return;
    }
    if (!st->blobs) {
        exe_op_fail(op, "server", "this executor has no registry blob store (start it with --blob-dir)");
        return;
    }
    char err[512];
    void *buf;
    size_t len;
    if (blob_get(st->blobs, digest, &buf, &len, err, sizeof err) < 0) {
        exe_op_fail(op, "server", "checkpoint %s cannot be loaded: %s", path, err);
        return;
    }
    /* A model whose state this executor lost (restart) is rebuilt from the checkpoint. */
    adapter *ad = exe_slot_find(st, op->model_id);
    bool fresh = false;
    if (!ad) {
        if (!(ad = adapter_create(st->model, &op->lcfg, err, sizeof err))) {
            free(buf);
            exe_op_fail(op, "server", "cannot create the model's adapter: %s", err);
            return;
        }
        fresh = true;
    }
    if (adapter_io_restore(ad, buf, len, optimizer, err, sizeof err) < 0) {
        free(buf);
        if (fresh) adapter_free(ad);
        exe_op_fail(op, "user", "checkpoint %s does not fit model %s: %s", path, op->model_id, err);
        return;
    }
    free(buf);
    if (fresh) exe_slot_put(st, op->model_id, ad);
    log_info("load_weights %s into %s (optimizer %s, step %lld)", path, op->model_id, optimizer ? "yes" : "no",
             (long long)adapter_step(ad));
    op->result = json_pack("{s:s, s:s, s:s}", "path", path, "model_id", op->model_id, "type", "load_weights");
}

const exe_handler_entry exe_ckpt_handlers[] = {
    {"save_weights", run_save_weights},
    {"save_weights_for_sampler", run_save_sampler},   /* the named form; the unnamed one is a snapshot */
    {"load_weights", run_load_weights},
    {NULL, NULL},
};

/* ---- sampler adapters from the registry ---------------------------------------------- */

#define SAMPLER_CACHE_KEEP 8    /* unpinned adapters kept for reuse */

typedef struct {
    char digest[BLOB_DIGEST_HEX];
    adapter *ad;
    int pins;
    uint64_t last_use;
} cache_entry;

static cache_entry *g_cache;
static int g_ncache, g_capcache;
static uint64_t g_clock;

static void cache_trim(void) {
    for (;;) {
        int unpinned = 0, lru = -1;
        for (int i = 0; i < g_ncache; i++) {
            if (g_cache[i].pins) continue;
            unpinned++;
            if (lru < 0 || g_cache[i].last_use < g_cache[lru].last_use) lru = i;
        }
        if (unpinned <= SAMPLER_CACHE_KEEP) return;
        adapter_free(g_cache[lru].ad);
        g_cache[lru] = g_cache[--g_ncache];
    }
}

int exe_load_sampler_adapter(exe_state *st, const char *digest, adapter **out, char *err, size_t errlen) {
    *out = NULL;
    for (int i = 0; i < g_ncache; i++) {
        if (strcmp(g_cache[i].digest, digest)) continue;
        g_cache[i].pins++;
        g_cache[i].last_use = ++g_clock;
        *out = g_cache[i].ad;
        return 0;
    }
    if (!st->blobs) { snprintf(err, errlen, "this executor has no registry blob store (--blob-dir)"); return -1; }
    void *buf;
    size_t len;
    if (blob_get(st->blobs, digest, &buf, &len, err, errlen) < 0) return -1;
    adapter *ad = adapter_io_decode(st->model, buf, len, err, errlen);
    free(buf);
    if (!ad) return -1;
    if (g_ncache == g_capcache) {
        int cap = g_capcache ? 2 * g_capcache : 16;
        cache_entry *n = realloc(g_cache, cap * sizeof *n);
        if (!n) { adapter_free(ad); snprintf(err, errlen, "out of memory"); return -1; }
        g_cache = n;
        g_capcache = cap;
    }
    cache_entry *e = &g_cache[g_ncache++];
    snprintf(e->digest, sizeof e->digest, "%s", digest);
    e->ad = ad;
    e->pins = 1;
    e->last_use = ++g_clock;
    *out = ad;
    cache_trim();
    return 0;
}

void exe_release_sampler_adapter(exe_state *st, adapter *ad) {
    (void)st;
    for (int i = 0; i < g_ncache; i++)
        if (g_cache[i].ad == ad && g_cache[i].pins > 0) {
            g_cache[i].pins--;
            break;
        }
    cache_trim();
}
