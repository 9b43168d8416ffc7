/* api_console.h: the web console (README "Web console"): its files, served by the event
 * loop from the copies compiled into the binary (the files of console/, embedded at build time, so it
 * works offline), and the read-only JSON routes its pages read. The key never travels in
 * a URL: the page keeps it in sessionStorage and sends it as X-API-Key. */
#pragma once
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "core/api_call.h"
#include <stddef.h>

typedef struct {
    int status;             /* 200, 302 (location) or 404 (body is the message) */
    const char *type;       /* Content-Type */
    const char *body;
    size_t len;
    const char *location;
} api_static;

/* The answer for a ROUTE_STATIC path ("/", "/console", "/console/", "/console/<file>"). */
void api_console_static(const char *path, size_t plen, api_static *out);

/* Tenant routes (the caller's own rows; another tenant's run is a 404). */
int api_h_console_whoami(api_call *c);        /* GET console/whoami */
int api_h_console_runs(api_call *c);          /* GET console/runs?limit&offset */
int api_h_console_run(api_call *c);           /* GET console/runs/{run} */
int api_h_console_checkpoints(api_call *c);   /* GET console/checkpoints (readable sampler ones) */
int api_h_console_download_link(api_call *c); /* GET console/download_link?path&format */
int api_h_console_tokenize(api_call *c);      /* POST console/tokenize {base_model, text, chat} */
int api_h_console_detokenize(api_call *c);    /* POST console/detokenize {base_model, ids} */
/* Operator routes (admin scope). */
int api_h_console_admin_overview(api_call *c); /* GET console/admin/overview */
int api_h_console_admin_cycles(api_call *c);   /* GET console/admin/cycles?limit */

/* A base model's tokenizer and chat template, as the api reads them from the directory the
 * executor registered (base_models.path). Loaded once per base model and kept: both are
 * read-only after loading, so worker threads and event loops share them. */
typedef struct {
    char name[256];
    tokenizer *tok;
    chat_template *chat;   /* NULL: the model has none */
    /* Where an answer to a chat-template prompt ends: the token the template writes after
     * an assistant's message (ChatML's <|im_end|>, Llama 3's <|eot_id|>) and the
     * template's eos_token, when they are tokens of the vocabulary. */
    int32_t turn_end[2];
    int n_turn_end;
} api_tokenizer;

/* The entry for base_model, loading it on first use. NULL with the error answered (404
 * for a base model not served here, 503 when its tokenizer cannot be read). */
const api_tokenizer *api_tokenizer_for(api_call *c, const char *base_model);
