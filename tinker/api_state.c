/* api_state.c: the api process's shared state (see api_state.h). */
#include "tinker/api_state.h"
#include "common/db.h"
#include "common/log.h"
#include "tinker/api_sql.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the link secret and the blob store ------------------------------------------------------ */

static unsigned char g_secret[32];
static bool g_have_secret;
static blobstore *g_blobs;

int api_state_init(const unsigned char secret[32], const char *blob_dir, char *err, size_t errlen) {
    memcpy(g_secret, secret, sizeof g_secret);
    g_have_secret = true;
    if (blob_dir && !(g_blobs = blob_open_dir(blob_dir, err, errlen))) return -1;
    return 0;
}

blobstore *api_blobs(void) { return g_blobs; }
const unsigned char *api_link_secret(void) { return g_have_secret ? g_secret : NULL; }

/* ---- the base models' tokenizers ---------------------------------------------------------- */

#define MAX_TOKENIZERS 16

static pthread_mutex_t g_tok_mu = PTHREAD_MUTEX_INITIALIZER;
static api_tokenizer g_toks[MAX_TOKENIZERS];
static int g_ntoks;

/* The template's end of an assistant's turn: an assistant message rendered with a marker
 * as its content; the token right after the marker, if it is a special one. Templates
 * differ (<|im_end|>, <|eot_id|>, <end_of_turn>), and the model's eos_token is often
 * another token (Qwen2.5's <|endoftext|>, Llama 3.1's <|end_of_text|>), so the template
 * is asked rather than the config. */
static void find_turn_end(api_tokenizer *e) {
    e->n_turn_end = 0;
    if (!e->chat) return;
    static const char mark[] = "LOOM_END_OF_TURN_MARK";
    json_t *msgs = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "user", "content", "Hi", "role", "assistant",
                             "content", mark);
    char *text = NULL, err[256];
    int32_t *ids = NULL;
    size_t n = 0;
    if (chat_template_render(e->chat, msgs, false, NULL, &text, NULL, err, sizeof err) == 0) {
        const char *at = strstr(text, mark);
        if (at && tok_encode(e->tok, at + strlen(mark), strlen(at + strlen(mark)), &ids, &n, NULL, err,
                             sizeof err) == 0 && n > 0 && tok_is_special(e->tok, ids[0]))
            e->turn_end[e->n_turn_end++] = ids[0];
    }
    json_decref(msgs);
    free(text);
    free(ids);
    const char *eos = chat_template_var(e->chat, "eos_token");
    int32_t id = eos ? tok_piece_to_id(e->tok, eos) : -1;
    if (id >= 0 && (e->n_turn_end == 0 || e->turn_end[0] != id)) e->turn_end[e->n_turn_end++] = id;
}

const api_tokenizer *api_tokenizer_for(api_call *c, const char *base_model) {
    pthread_mutex_lock(&g_tok_mu);
    for (int i = 0; i < g_ntoks; i++)
        if (!strcmp(g_toks[i].name, base_model)) {
            pthread_mutex_unlock(&g_tok_mu);
            return &g_toks[i];
        }
    pthread_mutex_unlock(&g_tok_mu);
    const char *p[1] = {base_model};
    PGresult *r = db_query(c->db, SQL_BASE_MODEL_DIR, 1, p, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "tokenizer", c->err), NULL;
    if (!PQntuples(r)) {
        PQclear(r);
        return api_error(c, 404, "base model %.200s is not served here", base_model), NULL;
    }
    char dir[1024], file[1100], err[512];
    snprintf(dir, sizeof dir, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    snprintf(file, sizeof file, "%s/tokenizer.json", dir);
    tokenizer *t = tok_load(file, err, sizeof err);
    /* The directory is the executor's (base_models.path): an api on another host needs a
     * copy of the tokenizer files there (docs/operating.md "Several machines"). */
    if (!t)
        return api_error(c, 503, "this api cannot read the tokenizer of %.200s (%.300s): copy the model's "
                                 "tokenizer.json and tokenizer_config.json (and chat_template.jinja, if it has "
                                 "one) to %.300s on this api host, or send token ids", base_model, err, dir), NULL;
    chat_template *ct = chat_template_load(dir, err, sizeof err);
    pthread_mutex_lock(&g_tok_mu);
    for (int i = 0; i < g_ntoks; i++)   /* another worker loaded it meanwhile */
        if (!strcmp(g_toks[i].name, base_model)) {
            pthread_mutex_unlock(&g_tok_mu);
            tok_free(t);
            chat_template_free(ct);
            return &g_toks[i];
        }
    if (g_ntoks == MAX_TOKENIZERS) {
        pthread_mutex_unlock(&g_tok_mu);
        tok_free(t);
        chat_template_free(ct);
        return api_error(c, 503, "this api holds the tokenizers of %d base models already", MAX_TOKENIZERS), NULL;
    }
    api_tokenizer *e = &g_toks[g_ntoks];
    snprintf(e->name, sizeof e->name, "%s", base_model);
    e->tok = t;
    e->chat = ct;
    find_turn_end(e);
    g_ntoks++;
    pthread_mutex_unlock(&g_tok_mu);
    log_info("console: tokenizer of %s loaded from %s%s", base_model, dir, ct ? " (with its chat template)" : "");
    return e;
}
