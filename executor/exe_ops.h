/* exe_ops.h: what the executor's loop (executor.c) shares with the files that implement
 * families of operations (exe_train.h, exe_sample.h, exe_ckpt.h). An operation handler
 * reads op->payload (the api's normalised JSON; a forward / forward_backward its packed
 * op->payload_bin, contract/fb_payload.h) and sets either op->result (the exact JSON the
 * client receives; a forward / forward_backward its JSON header and op->result_bin,
 * contract/fb_result.h) or an error via exe_op_fail. Handlers reach adapters only
 * through the store (exe_store.h) and their numbers only through the backend table. */
#pragma once
#include "backend/backend.h"
#include "executor/exe_store.h"
#include "model/lora.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct exe_state_ {
    const be_backend *be;
    void *ctx;
    model_config model;        /* the base model this executor serves */
    exe_store store;           /* every adapter it holds */
    struct blobstore *blobs;   /* registry blob store (checkpoints), NULL if not configured */
    const char *model_dir;     /* the base model's directory (tokenizer.json for stop strings) */
    const char *base_model;    /* its name (--model-name: base_models.name) */
    int64_t executor_id;
    int token_budget;          /* --token-budget, as registered (executors.token_budget) */
    PGconn *db;                /* the loop's connection while a cycle runs (access checks) */
    const char *db_conninfo;   /* for the snapshot writer's own connection */
    int snapshot_every;        /* optimizer steps between a model's snapshots */
    int evict_idle_s;          /* over budget, training slots idle this long are evicted */
    struct snap_writer *writer;   /* exe_durable.c */
    int64_t *expert_tokens;    /* MoE models: [sparse layers, experts] tokens routed to each
                                  expert by this executor's passes since it started (the
                                  operator's view, executors.expert_tokens), NULL until the
                                  first; dense models: NULL */
    tokenizer *tok;            /* for stop strings, loaded on first use (exe_sample.c) */
    bool tok_tried;
    char tok_err[512];
} exe_state;

typedef struct exe_op_ {
    int64_t id;
    char request_id[80];
    char model_id[256];
    char kind[32];
    int64_t tenant_id;         /* the model's (or sampling session's) tenant */
    char tenant_name[64];      /* its name (for the cycle's log line; cut to fit) */
    int64_t tokens;            /* operations.n_tokens */
    json_t *payload;
    uint8_t *payload_bin;      /* operations.payload_bin (malloc'd), NULL when none */
    size_t payload_bin_len;
    lora_config lcfg;
    /* outcome */
    json_t *result;
    uint8_t *result_bin;       /* operations.result_bin (malloc'd), NULL when none */
    size_t result_bin_len;
    char error[512];
    const char *category;   /* NULL = success */
    int64_t seq_id;
    int64_t state_seq;         /* its model's committed state_seq when the cycle started */
    bool applied;              /* it changed its model's training state (set by the handler;
                                  such operations are replayed on recovery) */
    char sampling_session_id[256];  /* sample ops */
    char snapshot_digest[65];       /* sample ops (BLOB_DIGEST_HEX): the blob of a sampler snapshot handed over
                                       by a draining executor ("": none) */
    /* Optional: runs inside the cycle's commit transaction, before the op's row is
     * updated (e.g. inserting the adapter_versions row of a checkpoint). A failure fails
     * the op (message in err, category server) without losing the rest of the cycle. */
    int (*commit_hook)(PGconn *c, struct exe_state_ *st, struct exe_op_ *op, char *err, size_t errlen);
    void *hook_data;                /* freed with free() after the commit */
} exe_op;

/* exe_ops.c */
void exe_op_fail(exe_op *op, const char *category, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The bytes of a cell of a binary-format result (a bytea) as a malloc'd copy of *len
 * bytes; NULL when out of memory. */
uint8_t *exe_copy_bytes(const PGresult *r, int row, int col, size_t *len);
/* The model's training slot, or NULL after failing op with a message that says its
 * state is not on this executor. */
be_adapter *exe_op_training_slot(exe_state *st, exe_op *op);

/* A handler of one kind of operation that runs after the cycle's training work (one op
 * at a time, in seq order per model): sets op->result or fails the op. The op family
 * files (exe_ckpt.h, exe_sample.h) export tables of them, ending with {NULL, NULL}. */
typedef void (*exe_op_handler)(exe_state *st, exe_op *op);
typedef struct {
    const char *kind;
    exe_op_handler run;
} exe_handler_entry;
