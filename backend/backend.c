/* backend.c — helpers made of backend table calls only, and the parts of sampling and of
 * mixture-of-experts layers every backend does alike (see backend.h). */
#include "backend/backend.h"
#include "common/err.h"

#include <math.h>
#include <string.h>

/* ---- sampling ---------------------------------------------------------------------------- */

int be_sample_check(const model_config *mc, const be_sample_req *r, char *err, size_t errlen)
{
    if (r->n_prompt < 1 || !r->prompt) { err_set(err, errlen, "empty prompt"); return -1; }
    if (r->n_prompt > mc->max_position_embeddings) {
        err_set(err, errlen, "prompt of %d tokens exceeds the model's context of %d", r->n_prompt, mc->max_position_embeddings);
        return -1;
    }
    if (r->num_samples < 1 || r->num_samples > 65536 || r->max_tokens < 0 || r->max_tokens > (1 << 24)) {
        err_set(err, errlen, "num_samples must be in 1..65536 and max_tokens ≥ 0");
        return -1;
    }
    if (!(r->temperature >= 0 && isfinite(r->temperature)) || !(r->top_p > 0 && r->top_p <= 1)) {
        err_set(err, errlen, "temperature must be ≥ 0 and top_p in (0, 1]");
        return -1;
    }
    if (r->max_tokens > 0 && (!r->tokens_out || !r->logprobs_out)) { err_set(err, errlen, "no output buffers"); return -1; }
    if (!r->n_out || !r->stopped_out || (r->n_stop > 0 && !r->stop_tokens) || r->n_stop < 0) {
        err_set(err, errlen, "no output buffers or stop list");
        return -1;
    }
    for (int t = 0; t < r->n_prompt; t++)
        if (r->prompt[t] < 0 || r->prompt[t] >= mc->vocab_size) {
            err_set(err, errlen, "prompt position %d: token id outside [0, %d)", t, mc->vocab_size);
            return -1;
        }
    return 0;
}

void be_sample_stream_init(be_sample_stream *s, be_sample_req *r, int index)
{
    *s = (be_sample_stream){.req = r, .index = index, .done = r->max_tokens == 0};
    rng_seed(&s->rng, r->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(index + 1)));
    r->n_out[index] = 0;
    r->stopped_out[index] = false;
}

void be_sample_record(be_sample_stream *s, int32_t tok, float lp, int max_pos)
{
    be_sample_req *r = s->req;
    long o = (long)s->index * r->max_tokens + s->n_gen;
    r->tokens_out[o] = tok;
    r->logprobs_out[o] = lp;
    s->n_gen++;
    s->last = tok;
    bool stop = false;
    for (int i = 0; i < r->n_stop && !stop; i++) stop = r->stop_tokens[i] == tok;
    if (!stop && r->stop_check)
        stop = r->stop_check(r, s->index, r->tokens_out + (long)s->index * r->max_tokens, s->n_gen);
    /* the next pass would feed `tok` at position n_prompt + n_gen − 1 */
    s->done = stop || s->n_gen >= r->max_tokens || r->n_prompt + s->n_gen > max_pos;
    r->n_out[s->index] = s->n_gen;
    r->stopped_out[s->index] = stop;
    if (r->on_token && r->on_token(r, s->index, s->n_gen, s->done)) s->done = true;
}

/* ---- adapters ------------------------------------------------------------------------------ */

int be_adapter_check_parts(const be_adapter *a, const lora_layout *other, unsigned parts, const char *who, char *err,
                           size_t errlen)
{
    if (!lora_layout_same(&a->layout, other)) {
        err_set(err, errlen, "%s: the two adapters have different layouts", who);
        return -1;
    }
    if ((parts & (ADAPTER_GRADS | ADAPTER_OPTIM)) && !a->trainable) {
        err_set(err, errlen, "%s: an adapter that is not trainable has no gradients or optimizer state", who);
        return -1;
    }
    return 0;
}

be_adapter *be_adapter_from_state(const be_backend *be, void *ctx, const adapter_state *st, bool trainable,
                                  char *err, size_t errlen)
{
    be_adapter *a = be->adapter_alloc(ctx, &st->layout.cfg, trainable, err, errlen);
    if (!a) return NULL;
    if (!lora_layout_same(&a->layout, &st->layout)) {
        err_set(err, errlen, "the adapter state does not fit this base model");
        be->adapter_free(ctx, a);
        return NULL;
    }
    unsigned parts = ADAPTER_PARAMS | (trainable ? ADAPTER_GRADS | ADAPTER_OPTIM : 0);
    if (be->adapter_upload(ctx, a, st, parts, err, errlen) < 0) {
        be->adapter_free(ctx, a);
        return NULL;
    }
    return a;
}

be_adapter *be_adapter_new(const be_backend *be, void *ctx, const lora_config *c, bool trainable, char *err,
                           size_t errlen)
{
    be_adapter *a = be->adapter_alloc(ctx, c, trainable, err, errlen);
    if (!a) return NULL;
    adapter_state st;
    if (adapter_state_alloc(&st, &a->layout, ADAPTER_PARAMS, err, errlen) < 0) {
        be->adapter_free(ctx, a);
        return NULL;
    }
    adapter_state_init_peft(&st);
    int rc = be->adapter_upload(ctx, a, &st, ADAPTER_PARAMS, err, errlen);
    adapter_state_free(&st);
    if (rc < 0) {
        be->adapter_free(ctx, a);
        return NULL;
    }
    return a;
}

int be_adapter_to_state(const be_backend *be, void *ctx, const be_adapter *a, unsigned parts, adapter_state *dst,
                        char *err, size_t errlen)
{
    if (adapter_state_alloc(dst, &a->layout, parts, err, errlen) < 0) return -1;
    if (be->adapter_download(ctx, a, dst, parts, err, errlen) < 0) {
        adapter_state_free(dst);
        return -1;
    }
    return 0;
}

/* ---- sparse layers ---------------------------------------------------------------------- */

void be_moe_group(const int32_t *sel, long T, int K, int E, int *off, int *fill, int32_t *a_pos, int32_t *a_tok)
{
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (long a = 0; a < T * K; a++) off[sel[a] + 1]++;
    for (int e = 0; e < E; e++) {
        off[e + 1] += off[e];
        fill[e] = off[e];
    }
    for (long t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int pos = fill[sel[t * K + k]]++;
            a_pos[t * K + k] = pos;
            a_tok[pos] = (int32_t)t;
        }
}

int be_moe_lower(const int32_t *a_tok, int lo, int hi, long t)
{
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (a_tok[mid] < t) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}
