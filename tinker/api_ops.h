/* api_ops.h: submitting an operation (a future) for a model: the model check, then one
 * transaction that inserts the operations row (state queued) and NOTIFYs the scheduler.
 * (model_id, seq_id) is the idempotency key: a resubmission returns the first request_id. */
#pragma once
#include "core/api_job.h"
#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OP_NAME_MAX 512

typedef struct {
    int64_t vocab_size;
    int64_t max_context;
    char session_id[OP_NAME_MAX];
    char base_model[OP_NAME_MAX];
    char optimizer[32];      /* the optimizer family fixed at create_model ("adamw") */
} op_model_info;

/* Finds the tenant's model and checks that it can take work. Returns 0, or an HTTP status
 * (404 unknown / other tenant, 400 not active or expired, 429 the tenant's queued
 * operations at its limit) with err, or -1 on a database error. */
int op_model_check(PGconn *db, int64_t tenant_id, const char *model_id, op_model_info *out,
                   char *err, size_t errlen);

/* op_model_check, its pass remembered for OP_MODEL_RECENT_S for the model and tenant
 * when the tenant has no queued-operations limit (a training loop's forward_backward and
 * optim_step, each a check before): *cached says the answer came from memory. What may
 * change meanwhile (the model unloaded, failed or expired, its session finished or
 * expired) the submit itself refuses (SQL_MODEL_SESSION): a 400 from op_submit after a
 * remembered check is re-checked with op_model_recheck for the right message. Bounded
 * (one slot per bucket of the model id's hash); thread-safe. */
#define OP_MODEL_RECENT_S 2.0
int op_model_check_recent(PGconn *db, int64_t tenant_id, const char *model_id, op_model_info *out, bool *cached,
                          char *err, size_t errlen);
/* After op_submit refused (status, with err) what a remembered check let through: the
 * model is forgotten and checked again; its refusal (status and err) when it has one, else
 * status and err as they were. */
int op_model_recheck(PGconn *db, int64_t tenant_id, const char *model_id, int status, char *err, size_t errlen);

/* The tenant's limits (loom tenant set-limits) at create_model and at a save: 0 under
 * them; 429 (active models at the limit: retry after unloading or a session's expiry) or
 * 400 (checkpoint bytes at the limit: delete some) with err; -1 on a database error. */
int op_check_live_models(PGconn *db, int64_t tenant_id, char *err, size_t errlen);
int op_check_storage(PGconn *db, int64_t tenant_id, char *err, size_t errlen);

typedef struct {
    int64_t tenant_id;
    const char *model_id;
    const char *kind;        /* operations.kind */
    bool has_seq_id;         /* false: the next free seq_id is allocated under a row lock */
    int64_t seq_id;
    const char *payload;     /* JSON text */
    const uint8_t *payload_bin;   /* operations.payload_bin (contract/fb_payload.h), or NULL */
    size_t payload_bin_len;
    int64_t n_tokens;
    /* Optional: more writes in the same transaction, after the row is inserted (not on a
     * resubmission). Returns 0, -1 (database error in err) or an HTTP status with err;
     * anything but 0 rolls the whole submission back. seq is the op's seq_id. */
    int (*in_tx)(PGconn *db, void *arg, const char *seq, char *err, size_t errlen);
    void *in_tx_arg;
} op_submit_req;

/* Returns 0 with request_id, an HTTP status (400, or in_tx's) with err for a conflicting
 * reuse of a seq_id, or -1 on a database error. */
int op_submit(PGconn *db, const op_submit_req *r, char request_id[API_REQUEST_ID_MAX], char *err,
              size_t errlen);

/* Answers a submit the api refuses with `status` and c->err, and, when it is a client
 * error (4xx) and the request named a model and a valid seq_id, records it as a failed
 * operation of that model (payload {"rejected": status}, the error and category "user"
 * kept for the audit trail): the SDK has used the seq_id up and never sends it again, so
 * the model's later operations must not wait for it; a later submit with that seq_id is
 * a 400 that quotes the refusal. Nothing is recorded for another tenant's or an inactive
 * model, or when the seq_id is taken, nor a 429 (a limit for now, answered with
 * Retry-After: the SDK sends the same seq_id again). Returns 0. */
typedef struct api_call api_call;
int op_reject(api_call *c, int status, const char *model_id, bool has_seq_id, int64_t seq_id,
              const char *kind);

/* The model_id (required) and seq_id (optional, 1 … 2^31-1; *has_seq_id says whether it
 * was sent) of a model operation's body. 0, or -1 with the 400 answered (nothing is
 * recorded: without a valid pair there is no seq_id to fill). */
int op_req_target(api_call *c, const char **model_id, int64_t *seq_id, bool *has_seq_id);

/* "req-" + 32 hex characters of fresh randomness. */
void op_new_request_id(char out[API_REQUEST_ID_MAX]);
