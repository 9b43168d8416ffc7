/* fb_payload.c: the forward / forward_backward payload codec (fb_payload.h): the api's
 * request in, the JSON header and the packed arrays out; the executor's reader. */
#include "contract/fb_payload.h"
#include "common/err.h"
#include "common/strbuf.h"
#include "contract/packed.h"
#include <stdlib.h>
#include <string.h>

#define BIT(i) (1u << (i))
#define DATUM_HEAD 12   /* n, k, inputs */

loss_spec fb_request_loss(const fb_request *r) {
    loss_spec ls = loss_spec_default(r->loss);
    for (size_t i = 0; i < r->n_config; i++) loss_config_set(&ls, r->config[i].key, r->config[i].value);
    return ls;
}

int64_t fb_total_tokens(const fb_request *r) {
    int64_t n = 0;
    for (size_t i = 0; i < r->n_data; i++) n += (int64_t)r->data[i].n_tokens;
    return n;
}

void fb_request_free(fb_request *r) {
    free(r->model_id);
    for (size_t i = 0; i < r->n_config; i++) free(r->config[i].key);
    free(r->config);
    for (size_t i = 0; i < r->n_data; i++) {
        free(r->data[i].tokens);
        for (int k = 0; k < LOSS_N_INPUTS; k++) {
            free(r->data[i].in[k].i);
            free(r->data[i].in[k].f);
        }
    }
    free(r->data);
    memset(r, 0, sizeof *r);
}

/* ---- encoding --------------------------------------------------------------------- */

/* {"loss_fn": ..., "loss_fn_config": {as sent, then the defaults of the keys the loss
 * reads and the request did not set}, "datums": N} */
static char *header_json(const fb_request *r, size_t *len) {
    strbuf b;
    sb_init(&b, 160);
    sb_puts(&b, "{\"loss_fn\": ");
    sb_json_str(&b, loss_kind_name(r->loss));
    sb_puts(&b, ", \"loss_fn_config\": {");
    bool first = true;
    for (size_t i = 0; i < r->n_config; i++) {
        if (!first) sb_puts(&b, ", ");
        first = false;
        sb_json_str(&b, r->config[i].key);
        sb_puts(&b, ": ");
        sb_double(&b, r->config[i].value);
    }
    loss_spec defaults = loss_spec_default(r->loss);
    for (int k = 0; k < LOSS_CONFIG_KEYS; k++) {
        if (!loss_config_used(r->loss, k)) continue;
        bool given = false;
        for (size_t i = 0; i < r->n_config; i++) given |= !strcmp(r->config[i].key, loss_config_keys[k]);
        if (given) continue;
        if (!first) sb_puts(&b, ", ");
        first = false;
        sb_json_str(&b, loss_config_keys[k]);
        sb_puts(&b, ": ");
        sb_double(&b, loss_config_get(&defaults, k));
    }
    sb_printf(&b, "}, \"datums\": %zu}", r->n_data);
    return sb_steal(&b, len);
}

/* The columns K of a datum's target_tokens and weights (the api checked that they agree). */
static size_t datum_k(const fb_datum *d) {
    const fb_tensor *tt = &d->in[LOSS_IN_TARGET_TOKENS];
    return tt->present && tt->k > 1 ? tt->k : 1;
}

static size_t input_len(const fb_datum *d, int k) {
    return k == LOSS_IN_TARGET_TOKENS || k == LOSS_IN_WEIGHTS ? d->n_tokens * datum_k(d) : d->n_tokens;
}

static uint8_t *put_ids(uint8_t *p, const int64_t *v, size_t n) {
    for (size_t i = 0; i < n; i++, p += 4) packed_put_u32(p, (uint32_t)(int32_t)v[i]);
    return p;
}

void fb_payload_encode(const fb_request *r, fb_payload *out) {
    out->header = header_json(r, &out->header_len);
    size_t len = FB_PAYLOAD_DATA_AT;
    for (size_t i = 0; i < r->n_data; i++) {
        const fb_datum *d = &r->data[i];
        len += DATUM_HEAD + 4 * d->n_tokens;
        for (int k = 0; k < LOSS_N_INPUTS; k++)
            if (d->in[k].present) len += 4 * input_len(d, k);
    }
    uint8_t *p = malloc(len);
    if (!p) abort();
    out->bin = p;
    out->bin_len = len;
    loss_spec ls = fb_request_loss(r);
    memcpy(p, FB_PAYLOAD_MAGIC, 4);
    packed_put_u32(p + 4, (uint32_t)ls.kind);
    packed_put_f64(p + 8, ls.clip_low);
    packed_put_f64(p + 16, ls.clip_high);
    packed_put_f64(p + 24, ls.beta);
    packed_put_u32(p + 32, (uint32_t)r->n_data);
    packed_put_u32(p + 36, 0);
    p += FB_PAYLOAD_DATA_AT;
    for (size_t i = 0; i < r->n_data; i++) {
        const fb_datum *d = &r->data[i];
        unsigned inputs = 0;
        for (int k = 0; k < LOSS_N_INPUTS; k++) inputs |= d->in[k].present ? BIT(k) : 0;
        packed_put_u32(p, (uint32_t)d->n_tokens);
        packed_put_u32(p + 4, (uint32_t)datum_k(d));
        packed_put_u32(p + 8, inputs);
        p = put_ids(p + DATUM_HEAD, d->tokens, d->n_tokens);
        for (int k = 0; k < LOSS_N_INPUTS; k++) {
            const fb_tensor *t = &d->in[k];
            if (!t->present) continue;
            size_t n = input_len(d, k);
            if (t->i) {
                p = put_ids(p, t->i, n);
            } else {
                packed_write_f32(p, t->f, n);
                p += 4 * n;
            }
        }
    }
}

void fb_payload_free(fb_payload *p) {
    free(p->header);
    free(p->bin);
    memset(p, 0, sizeof *p);
}

/* ---- reading ---------------------------------------------------------------------- */

int fb_payload_open(fb_payload_reader *rd, const uint8_t *bin, size_t len, char *err, size_t errlen) {
    memset(rd, 0, sizeof *rd);
    if (!bin || len < FB_PAYLOAD_DATA_AT || memcmp(bin, FB_PAYLOAD_MAGIC, 4) != 0) {
        err_set(err, errlen, "payload_bin is not a packed forward_backward payload (%zu bytes, format %s)", len,
                FB_PAYLOAD_MAGIC);
        return -1;
    }
    uint32_t kind = packed_get_u32(bin + 4);
    if (kind >= LOSS_N) {
        err_set(err, errlen, "payload_bin names loss %u, which is none of the %d losses", kind, LOSS_N);
        return -1;
    }
    rd->loss = (loss_spec){.kind = (loss_kind)kind, .clip_low = packed_get_f64(bin + 8),
                           .clip_high = packed_get_f64(bin + 16), .beta = packed_get_f64(bin + 24)};
    rd->datums = packed_get_u32(bin + 32);
    rd->at = bin + FB_PAYLOAD_DATA_AT;
    rd->end = bin + len;
    return 0;
}

/* n 4-byte values at rd->at into a new array, or NULL with err when they do not fit. */
static void *take4(fb_payload_reader *rd, uint64_t n, const char *what, char *err, size_t errlen) {
    if (n > (uint64_t)(rd->end - rd->at) / 4) {
        err_set(err, errlen, "datum %zu: %s needs %llu bytes, %zu are left in payload_bin", rd->read, what,
                (unsigned long long)n * 4, (size_t)(rd->end - rd->at));
        return NULL;
    }
    void *v = malloc(n ? n * 4 : 1);
    if (!v) abort();
    packed_read4(v, rd->at, n);
    rd->at += n * 4;
    return v;
}

int fb_payload_next(fb_payload_reader *rd, fb_payload_datum *d, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    if (rd->read == rd->datums) {
        if (rd->at == rd->end) return 0;
        err_set(err, errlen, "payload_bin has %zu bytes after its %zu datums", (size_t)(rd->end - rd->at), rd->datums);
        return -1;
    }
    if (rd->end - rd->at < DATUM_HEAD) {
        err_set(err, errlen, "payload_bin ends at datum %zu of %zu", rd->read, rd->datums);
        return -1;
    }
    uint32_t n = packed_get_u32(rd->at), k = packed_get_u32(rd->at + 4), inputs = packed_get_u32(rd->at + 8);
    if (k < 1 || inputs >> LOSS_N_INPUTS) {
        err_set(err, errlen, "datum %zu: %u columns and inputs 0x%x are not a datum (k >= 1, %d inputs)", rd->read,
                k, inputs, LOSS_N_INPUTS);
        return -1;
    }
    rd->at += DATUM_HEAD;
    d->n = n;
    d->k = k;
    if (!(d->tokens = take4(rd, n, "model_input", err, errlen))) return -1;
    for (int i = 0; i < LOSS_N_INPUTS; i++) {
        if (!(inputs & BIT(i))) continue;
        uint64_t len = i == LOSS_IN_TARGET_TOKENS || i == LOSS_IN_WEIGHTS ? (uint64_t)n * k : n;
        void *v = take4(rd, len, loss_input_names[i], err, errlen);
        if (!v) {
            fb_payload_datum_free(d);
            return -1;
        }
        d->has[i] = true;
        if (i == LOSS_IN_TARGET_TOKENS) d->targets = v;
        else d->f[i] = v;
    }
    rd->read++;
    return 1;
}

void fb_payload_datum_free(fb_payload_datum *d) {
    free(d->tokens);
    free(d->targets);
    for (int i = 0; i < LOSS_N_INPUTS; i++) free(d->f[i]);
    memset(d, 0, sizeof *d);
}
