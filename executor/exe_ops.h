/* exe_ops.h: what the executor's loop (executor.c) shares with the files that implement
 * families of operations (exe_train.c, exe_sample.c, exe_ckpt.c). An operation handler
 * reads op->payload (the api's normalised JSON) and sets either op->result (the exact
 * JSON the client receives) or an error via exe_op_fail. Handlers reach adapters only
 * through the store (exe_store.h) and their numbers only through the backend table. */
#pragma once
#include "backend/backend.h"
#include "executor/exe_store.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct exe_state_ {
    const exe_backend *be;
    void *ctx;
    model_config model;        /* the base model this executor serves */
    exe_store store;           /* every adapter it holds */
    struct blobstore *blobs;   /* registry blob store (checkpoints), NULL if not configured */
    const char *model_dir;     /* the base model's directory (tokenizer.json for stop strings) */
    int64_t executor_id;
    tokenizer *tok;            /* for stop strings, loaded on first use (exe_sample.c) */
    bool tok_tried;
    char tok_err[512];
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

/* exe_ops.c */
void exe_op_fail(exe_op *op, const char *category, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The model's training slot, or NULL after failing op with a message that says its
 * state is not on this executor. */
exe_adapter *exe_op_training_slot(exe_state *st, exe_op *op);

/* Handlers for the kinds that run after the cycle's training work (one op at a time,
 * in seq order per model). Each sets op->result or fails the op. */
typedef void (*exe_op_handler)(exe_state *st, exe_op *op);
typedef struct {
    const char *kind;
    exe_op_handler run;
} exe_handler_entry;
/* Defined by each op family file; executor.c looks kinds up in these tables. */
extern const exe_handler_entry exe_ckpt_handlers[];   /* exe_ckpt.c: ends with {NULL, NULL} */
extern const exe_handler_entry exe_sample_handlers[];  /* exe_sample.c: ends with {NULL, NULL} */

/* exe_ckpt.c: a registry blob (sampler or training checkpoint, by sha256 digest) as an
 * inference adapter for this executor's base model, cached in the store. The blob is read
 * verified (a corrupted one is an error saying so). *out is pinned: it stays valid until
 * exe_store_release (call it once per successful load, e.g. when the sample batch is done). */
int exe_load_sampler_adapter(exe_state *st, const char *digest, exe_adapter **out, char *err, size_t errlen);

/* exe_sample.c: every 'sample' op of the cycle, run together through backend->sample
 * (and a forward pass for prompt_logprobs), and the unnamed save_weights_for_sampler
 * (payload has "sampling_session_id"): a snapshot of the model's adapter in the store,
 * keyed by the sampling session id; its commit hook sets sampling_sessions.executor_id
 * so the scheduler sends that session's samples here. */
void exe_run_sample_batch(exe_state *st, exe_op **ops, int nops);
void exe_run_snapshot(exe_state *st, exe_op *op);

/* exe_train.c */
void exe_run_create(exe_state *st, exe_op *op);
/* Packs every datum of ops into one batch (backward or forward only) and sets results. */
void exe_run_fb_batch(exe_state *st, exe_op **ops, int nops, bool backward);
void exe_run_optim(exe_state *st, exe_op *op);
/* The one validation of a sequence before it reaches a backend (backends trust it):
 * token ids in the vocabulary, length within the context, a known loss with its RL inputs
 * and sane clip bounds, 2-D targets only for cross_entropy (k ≤ EXE_MAX_K), top-k within
 * bounds with output buffers. 0 ok, -1 with err. */
int exe_seq_check(const model_config *mc, const exe_seq *s, char *err, size_t errlen);
