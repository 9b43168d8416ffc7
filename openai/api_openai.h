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
#include "core/api_route.h"
#include "core/http_server.h"
#include "tinker/api_state.h"
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
/* That shape, for the OpenAI routes and the paths under /v1/ (core/api_route.h). */
extern const api_error_shape oai_error_shape;

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

/* The OpenAI routes as a loop extension (core/http_server.h), registered by `loom api`
 * before its loops start: each loop's streams, and the jobs (job->loop_ext, job->ext: the
 * oai_spec) an accepted request and the loop's own looks come back as. */
extern const http_loop_ext oai_loop_ext;
/* The LISTEN thread's callback for CHAN_SAMPLE_PROGRESS (any thread; payload NULL after a
 * reconnect). */
void oai_progress(const char *payload, void *arg);
