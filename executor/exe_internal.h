/* exe_internal.h: what the executor's loop (executor.c) shares with the files that
 * implement families of operations (exe_train.c; sampling and checkpoints next). An
 * operation handler reads op->payload (the api's normalised JSON) and sets either
 * op->result (the exact JSON the client receives) or an error via exe_op_fail. */
#pragma once
#include "backend/backend.h"
#include "model/lora.h"
#include "model/model.h"
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <libpq-fe.h>

typedef struct {
    char id[256];
    adapter *ad;
} model_slot;

typedef struct exe_state_ {
    const exe_backend *be;
    void *ctx;
    base_model *model;
    int vocab;
    model_slot *slots;
    int nslots, cap;
    struct blobstore *blobs;   /* registry blob store (checkpoints), NULL if not configured */
    const char *model_dir;     /* the base model's directory (tokenizer.json for stop strings) */
    int64_t executor_id;
} exe_state;

typedef struct exe_op_ {
    int64_t id;
    char request_id[80];
    char model_id[256];
    char kind[32];
    json_t *payload;
    lora_config lcfg;
    /* outcome */
    json_t *result;
    char error[512];
    const char *category;   /* NULL = success */
    int64_t seq_id;
    char sampling_session_id[256];  /* sample ops */
    /* Optional: runs inside the cycle's commit transaction, before the op's row is
     * updated (e.g. inserting the adapter_versions row of a checkpoint). A failure fails
     * the op (message in err, category server) without losing the rest of the cycle. */
    int (*commit_hook)(PGconn *c, struct exe_state_ *st, struct exe_op_ *op, char *err, size_t errlen);
    void *hook_data;                /* freed with free() after the commit */
} exe_op;

adapter *exe_slot_find(exe_state *st, const char *model_id);
void exe_slot_put(exe_state *st, const char *model_id, adapter *ad);
void exe_op_fail(exe_op *op, const char *category, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Handlers for the kinds that run after the cycle's training work (one op at a time,
 * in seq order per model). Each sets op->result or fails the op. */
typedef void (*exe_op_handler)(exe_state *st, exe_op *op);
typedef struct {
    const char *kind;
    exe_op_handler run;
} exe_handler_entry;
/* Defined by each op family file; executor.c looks kinds up in these tables. */
extern const exe_handler_entry exe_ckpt_handlers[];   /* exe_ckpt.c: ends with {NULL, NULL} */
/* exe_ckpt.c: a registry blob (sampler or training checkpoint, by sha256 digest) as an
 * inference adapter for this executor's base model. The blob is read verified (a
 * corrupted one is an error saying so). *out stays owned by a small cache keyed by
 * digest and is pinned: it stays valid until the matching exe_release_sampler_adapter
 * (call it once per successful load, e.g. when the sample batch is done). */
int exe_load_sampler_adapter(exe_state *st, const char *digest, adapter **out, char *err, size_t errlen);
void exe_release_sampler_adapter(exe_state *st, adapter *ad);
extern const exe_handler_entry exe_sample_handlers[];  /* exe_sample.c: ends with {NULL, NULL} */

/* exe_sample.c: every 'sample' op of the cycle, run together through backend->sample
 * (and a forward pass for prompt_logprobs), and the unnamed save_weights_for_sampler
 * (payload has "sampling_session_id"): an in-memory snapshot of the model's adapter,
 * keyed by the sampling session id; its commit hook sets sampling_sessions.executor_id
 * so the scheduler sends that session's samples here. */
void exe_run_sample_batch(exe_state *st, exe_op **ops, int nops);
void exe_run_snapshot(exe_state *st, exe_op *op);

/* exe_train.c */
void exe_run_create(exe_state *st, exe_op *op);
/* Packs every datum of ops into one batch (backward or forward only) and sets results. */
void exe_run_fb_batch(exe_state *st, exe_op **ops, int nops, bool backward);
void exe_run_optim(exe_state *st, exe_op *op);
