/* exe_ckpt.c: checkpoint operations against the registry: save_weights (weights + Adam
 * state), the named save_weights_for_sampler (weights only; with "external" in its
 * payload, save_weights_external: the same weights under external_weights/), load_weights,
 * and the loader of sampler adapters for the sampling code. Adapters cross between the backend
 * and the blobs only as host states (adapter_download / adapter_upload, model/lora.h).
 *
 * A save downloads the adapter, serialises it (model/adapter_io.c) and stores the blob before the cycle
 * commits; its commit hook then, inside the cycle's transaction, takes the digest's
 * shared lock (registry GC takes it exclusive), stores the blob again if GC removed it
 * meanwhile, and writes the adapter_versions row with its provenance. A name that
 * exists (overwrite false) fails the op with category user and writes nothing. */
#include "model/adapter_io.h"
#include "executor/exe_ckpt.h"
#include "registry/blobstore.h"
#include "registry/registry.h"
#include "common/log.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the commit hook needs; one malloc block (hook_data is released with free()). */
typedef struct {
    char kind[16];                 /* "training" | "sampler" | "external" */
    char name[REG_NAME_MAX + 1];
    char digest[BLOB_DIGEST_HEX];
    int64_t step, ttl_seconds, key_id;
    bool overwrite;
    size_t len;
    uint8_t bytes[];               /* the blob, to store again if GC took it */
} save_hook_data;

int exe_adapter_to_blob(exe_state *st, be_adapter *ad, bool training, uint8_t **bytes, size_t *len,
                        char digest[BLOB_DIGEST_HEX], char *err, size_t errlen) {
    if (!st->blobs) {
        snprintf(err, errlen, "this executor has no registry blob store (start it with --blob-dir)");
        return -1;
    }
    adapter_state host;
    char why[512];
    if (be_adapter_to_state(st->be, st->ctx, ad, ADAPTER_PARAMS | (training ? ADAPTER_OPTIM : 0), &host, why,
                            sizeof why) < 0) {
        snprintf(err, errlen, "reading the adapter from the device failed: %s", why);
        return -1;
    }
    int rc = adapter_io_encode(&host, training, bytes, len, why, sizeof why);
    adapter_state_free(&host);
    if (rc < 0) {
        snprintf(err, errlen, "serialising the adapter failed: %s", why);
        return -1;
    }
    if (blob_put(st->blobs, *bytes, *len, digest, why, sizeof why) < 0) {
        free(*bytes);
        *bytes = NULL;
        snprintf(err, errlen, "storing it failed: %s", why);
        return -1;
    }
    return 0;
}

int exe_blob_hold(exe_state *st, PGconn *c, const char *digest, const void *bytes, size_t len, char *err,
                  size_t errlen) {
    if (reg_blob_lock_shared(c, digest, err, errlen) < 0) return -1;
    if (blob_exists(st->blobs, digest)) return 0;
    char dg[BLOB_DIGEST_HEX];
    log_warn("blob %s vanished before the row naming it was written (registry GC?); storing it again", digest);
    return blob_put(st->blobs, bytes, len, dg, err, errlen);
}

static int save_hook(PGconn *c, exe_state *st, exe_op *op, char *err, size_t errlen) {
    save_hook_data *h = op->hook_data;
    if (exe_blob_hold(st, c, h->digest, h->bytes, h->len, err, errlen) < 0) return -1;
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

static void run_save(exe_state *st, exe_op *op, const char *kind) {
    json_t *p = op->payload;
    const char *name = json_string_value(json_object_get(p, "path"));
    char err[512];
    if (!name || !reg_name_valid(name, err, sizeof err)) {
        exe_op_fail(op, "user", "checkpoint name: %s", name ? err : "missing");
        return;
    }
    be_adapter *ad = exe_op_training_slot(st, op);
    if (!ad) return;
    bool training = !strcmp(kind, "training");
    uint8_t *bytes;
    size_t len;
    char digest[BLOB_DIGEST_HEX];
    if (exe_adapter_to_blob(st, ad, training, &bytes, &len, digest, err, sizeof err) < 0) {
        exe_op_fail(op, "server", "checkpoint: %s", err);
        return;
    }
    save_hook_data *h = malloc(sizeof *h + len);
    if (!h) {
        free(bytes);
        exe_op_fail(op, "server", "out of memory holding a %zu-byte checkpoint", len);
        return;
    }
    memset(h, 0, sizeof *h);
    snprintf(h->digest, sizeof h->digest, "%s", digest);
    snprintf(h->kind, sizeof h->kind, "%s", kind);
    snprintf(h->name, sizeof h->name, "%s", name);
    h->step = ad->step;
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
    if (!strcmp(kind, "external"))   /* SaveWeightsExternalResponseInternal */
        op->result = json_pack("{s:s, s:I, s:s}", "path", path, "size_bytes", (json_int_t)len, "type",
                               "save_weights_external");
    else
        op->result = json_pack("{s:s, s:s}", "path", path, "type", training ? OP_SAVE_WEIGHTS : OP_SAVE_FOR_SAMPLER);
}

static void run_save_weights(exe_state *st, exe_op *op) { run_save(st, op, "training"); }
static void run_save_sampler(exe_state *st, exe_op *op) {
    run_save(st, op, json_is_true(json_object_get(op->payload, "external")) ? "external" : "sampler");
}

/* Access is checked again when load_weights runs, not only at submit: a checkpoint
 * unpublished, unshared, deleted, expired or replaced (saved again under its name) since
 * then is not loaded. false: op failed. */
static bool still_readable(exe_state *st, exe_op *op, const char *path, int64_t version_id) {
    reg_version v;
    char err[512];
    int rc = st->db ? reg_find_readable(st->db, op->tenant_id, path, &v, err, sizeof err) : -1;
    if (rc < 0) {
        exe_op_fail(op, "server", "could not check access to checkpoint %s: %s", path, st->db ? err : "no database");
        return false;
    }
    if (rc > 0 || v.id != version_id) {
        exe_op_fail(op, "user", "checkpoint %s can no longer be loaded into %s: since load_weights was submitted it "
                    "was unpublished, unshared, deleted, expired or saved again; submit load_weights again if it is "
                    "still readable to you", path, op->model_id);
        return false;
    }
    return true;
}

void exe_load_checkpoint(exe_state *st, exe_op *op) {
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
    /* The checkpoint is checked against the model's layout on the host first, so that a
     * bad one leaves the slot as it was. A model whose state this executor lost (restart)
     * is rebuilt from the checkpoint. */
    be_adapter *ad = exe_store_get(&st->store, STORE_TRAINING, op->model_id);
    lora_layout layout;
    adapter_state host = {0};
    int rc = lora_layout_init(&layout, &st->model, &op->lcfg, err, sizeof err);
    if (rc == 0) {
        rc = adapter_state_alloc(&host, &layout, ADAPTER_PARAMS | (optimizer ? ADAPTER_OPTIM : 0), err, sizeof err);
        lora_layout_free(&layout);
    }
    if (rc < 0) {
        free(buf);
        exe_op_fail(op, "server", "cannot hold the checkpoint: %s", err);
        return;
    }
    rc = adapter_io_restore(&host, buf, len, optimizer, err, sizeof err);
    free(buf);
    if (rc < 0) {
        adapter_state_free(&host);
        exe_op_fail(op, "user", "checkpoint %s does not fit model %s: %s", path, op->model_id, err);
        return;
    }
    /* Weights, and Adam state (zeros when the optimizer is not loaded); gradients zero. */
    if (ad) rc = st->be->adapter_upload(st->ctx, ad, &host, ADAPTER_PARAMS | ADAPTER_GRADS | ADAPTER_OPTIM, err,
                                        sizeof err);
    else if (!(ad = be_adapter_from_state(st->be, st->ctx, &host, true, err, sizeof err)) ||
             exe_store_put(&st->store, STORE_TRAINING, op->model_id, ad, false, err, sizeof err) < 0)
        rc = -1;
    adapter_state_free(&host);
    if (rc < 0) {
        exe_op_fail(op, "server", "cannot load the checkpoint into the model's adapter: %s", err);
        return;
    }
    op->applied = true;
    log_info("load_weights %s into %s (optimizer %s, step %lld)", path, op->model_id, optimizer ? "yes" : "no",
             (long long)ad->step);
    op->result = json_pack("{s:s, s:s, s:s}", "path", path, "model_id", op->model_id, "type", OP_LOAD_WEIGHTS);
}

static void run_load_weights(exe_state *st, exe_op *op) {
    const char *path = json_string_value(json_object_get(op->payload, "path"));
    json_int_t version_id = json_integer_value(json_object_get(op->payload, "version_id"));
    if (path && !still_readable(st, op, path, version_id)) return;
    exe_load_checkpoint(st, op);
}

const exe_handler_entry exe_ckpt_handlers[] = {
    {OP_SAVE_WEIGHTS, run_save_weights},
    {OP_SAVE_FOR_SAMPLER, run_save_sampler},   /* the named form; the unnamed one is a snapshot */
    {OP_LOAD_WEIGHTS, run_load_weights},
    {NULL, NULL},
};

/* ---- sampler adapters from the registry ---------------------------------------------- */

int exe_load_sampler_adapter(exe_state *st, const char *digest, be_adapter **out, char *err, size_t errlen) {
    if ((*out = exe_store_acquire(&st->store, STORE_CHECKPOINT, digest))) return 0;
    if (!st->blobs) { snprintf(err, errlen, "this executor has no registry blob store (--blob-dir)"); return -1; }
    void *buf;
    size_t len;
    if (blob_get(st->blobs, digest, &buf, &len, err, errlen) < 0) return -1;
    adapter_state host;
    int rc = adapter_io_decode(&st->model, buf, len, &host, err, errlen);
    free(buf);
    if (rc < 0) return -1;
    be_adapter *ad = be_adapter_from_state(st->be, st->ctx, &host, false, err, errlen);
    adapter_state_free(&host);
    if (!ad || exe_store_put(&st->store, STORE_CHECKPOINT, digest, ad, true, err, errlen) < 0) return -1;
    *out = ad;
    return 0;
}
