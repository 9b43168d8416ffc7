/* api_openai.h: the OpenAI-compatible routes (docs/protocol.md §18): GET /v1/models,
 * POST /v1/completions and /v1/chat/completions, and the aliases of checkpoints.
 *
 * A completion is a sample operation like asample's (its payload asks for "progress"), so
 * it is scheduled into cycles with training, under the tenant's limits, and decoded in
 * one batch with every other sample of its cycle. Two halves:
 *  - api_openai.c, on a database worker: reads and checks the request, renders the chat
 *    template, tokenises, inserts the operations, and hands an oai_spec to its event loop
 *    (job->oai);
 *  - api_openai_stream.c, on the event loop: follows the operations (progress lines from
 *    the executors, NOTIFY loom_op_done, a look at the database when either is late),
 *    turns tokens into text and answers: server-sent events as tokens arrive, or one JSON
 *    body at the end. */
#pragma once
#include "core/api_call.h"
#include "console/api_console.h"
#include <stdbool.h>
#include <stdint.h>

#define OAI_MAX_PROMPTS 16        /* prompts of one /v1/completions request */
#define OAI_MAX_STOP 16           /* stop strings of one request */

enum { OAI_ANSWER = 1, OAI_FETCH, OAI_CANCEL };

/* What an accepted request needs on its loop. */
typedef struct oai_spec {
    int kind;                     /* OAI_ANSWER, or (the loop's own jobs) OAI_FETCH / OAI_CANCEL */
    bool chat, stream, include_usage, token_ids;
    int n;                        /* choices per prompt */
    int nprompts;
    char request_ids[OAI_MAX_PROMPTS][API_REQUEST_ID_MAX];
    int prompt_tokens;            /* all prompts together */
    int logprobs;                 /* -1: none; else the top alternatives per token (0 … 20) */
    char id[48];                  /* chatcmpl-… / cmpl-… */
    int64_t created;
    char *model;                  /* as the client named it (malloc'd) */
    int64_t tenant_id;
    const api_tokenizer *tok;     /* the base model's (shared, never freed) */
    char *stop[OAI_MAX_STOP];     /* stop strings (malloc'd): the text ends before them */
    size_t stop_len[OAI_MAX_STOP];
    int nstop;
    size_t stop_max;
    /* OAI_FETCH / OAI_CANCEL: the request they look at */
    char fetch_id[API_REQUEST_ID_MAX];
    void *waiter;                 /* OAI_FETCH: the oai_stream waiting for it, NULL once it is gone */
} oai_spec;

void oai_spec_free(oai_spec *s);

/* {"error": {"message", "type", "param", "code"}} (malloc'd), the type from the status. */
char *oai_error_body(int status, const char *msg, const char *param, const char *code, size_t *len);

/* Route handlers (database workers). */
int api_h_oai_models(api_call *c);          /* GET /v1/models */
int api_h_oai_model(api_call *c);           /* GET /v1/models/{id} */
int api_h_oai_completions(api_call *c);     /* POST /v1/completions */
int api_h_oai_chat(api_call *c);            /* POST /v1/chat/completions */
int api_h_aliases_list(api_call *c);        /* GET /api/v1/aliases */
int api_h_alias_put(api_call *c);           /* PUT /api/v1/aliases/{alias} */
int api_h_alias_delete(api_call *c);        /* DELETE /api/v1/aliases/{alias} */
/* The loop's own jobs (OAI_FETCH, OAI_CANCEL), run like a route's handler. */
int api_h_oai_internal(api_call *c);

/* ---- the event loop's side (api_openai_stream.c) ------------------------------------------ */

typedef struct oai_loop oai_loop;
typedef struct http_loop http_loop;

/* Per event loop: called by the loop thread before it serves requests. */
oai_loop *oai_loop_new(http_loop *L, h2o_evloop_t *evloop, h2o_multithread_queue_t *queue);
/* A job with job->oai came back to its loop: an accepted request (req its h2o request, or
 * NULL when the client went away meanwhile) or one of the loop's own jobs. Takes the job. */
void oai_job_back(oai_loop *ol, api_job *job, h2o_req_t *req);
/* NOTIFY loom_op_done for request_id arrived (NULL: some may have been missed). Loop thread. */
void oai_op_done(oai_loop *ol, const char *request_id);
/* The LISTEN thread's callback for CHAN_SAMPLE_PROGRESS (any thread; payload NULL after a
 * reconnect). */
void oai_progress(const char *payload, void *arg);
