/* fb_result.c: the forward / forward_backward result codec (fb_result.h): the executor's
 * outputs in, the packed result and its JSON header out; the api's view and the JSON the
 * client receives. */
#include "contract/fb_result.h"
#include "common/err.h"
#include "common/strbuf.h"
#include "contract/packed.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEAD 16
#define METRIC_SIZE (FB_METRIC_KEY_MAX + 8)

double fb_result_round(double v) {
    char t[40];
    snprintf(t, sizeof t, "%.9g", v);
    return strtod(t, NULL);
}

/* jsonb's key order: shorter first, then bytewise. */
static int key_order(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la != lb) return la < lb ? -1 : 1;
    return memcmp(a, b, la);
}

static int metric_cmp(const void *a, const void *b) {
    return key_order(((const fb_metric *)a)->key, ((const fb_metric *)b)->key);
}

static bool all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

uint8_t *fb_result_encode(const fb_metric *metrics, size_t n_metrics, const fb_output *out, size_t n_out,
                          size_t *len) {
    fb_metric *m = malloc((n_metrics ? n_metrics : 1) * sizeof *m);
    if (!m) return NULL;
    memcpy(m, metrics, n_metrics * sizeof *m);
    qsort(m, n_metrics, sizeof *m, metric_cmp);
    size_t size = HEAD + n_metrics * METRIC_SIZE;
    bool ok = true;
    for (size_t i = 0; i < n_metrics; i++) {
        ok &= m[i].key[0] && memchr(m[i].key, 0, FB_METRIC_KEY_MAX) != NULL && isfinite(m[i].value);
        ok &= i == 0 || key_order(m[i - 1].key, m[i].key) < 0;
    }
    for (size_t d = 0; d < n_out; d++) {
        size_t k = out[d].k ? out[d].k : 1;
        ok &= all_finite(out[d].logprobs, out[d].n * k) && all_finite(out[d].loss, out[d].n);
        size += 8 + 4 * out[d].n * (k + 1);
    }
    uint8_t *b = ok ? malloc(size) : NULL;
    if (!b) {
        free(m);
        return NULL;
    }
    memcpy(b, FB_RESULT_MAGIC, 4);
    packed_put_u32(b + 4, (uint32_t)n_out);
    packed_put_u32(b + 8, (uint32_t)n_metrics);
    packed_put_u32(b + 12, 0);
    uint8_t *p = b + HEAD;
    for (size_t i = 0; i < n_metrics; i++, p += METRIC_SIZE) {
        memset(p, 0, FB_METRIC_KEY_MAX);
        memcpy(p, m[i].key, strlen(m[i].key));
        packed_put_f64(p + FB_METRIC_KEY_MAX, fb_result_round(m[i].value) + 0.0);   /* no negative zero */
    }
    free(m);
    for (size_t d = 0; d < n_out; d++) {
        size_t n = out[d].n, k = out[d].k ? out[d].k : 1;
        packed_put_u32(p, (uint32_t)n);
        packed_put_u32(p + 4, (uint32_t)k);
        packed_write_f32(p + 8, out[d].logprobs, n * k);
        packed_write_f32(p + 8 + 4 * n * k, out[d].loss, n);
        p += 8 + 4 * n * (k + 1);
    }
    *len = size;
    return b;
}

json_t *fb_result_header(const fb_metric *metrics, size_t n_metrics) {
    json_t *m = json_object();
    for (size_t i = 0; i < n_metrics; i++)
        json_object_set_new(m, metrics[i].key, json_real(fb_result_round(metrics[i].value)));
    return json_pack("{s:o, s:s}", "metrics", m, "loss_fn_output_type", "ArrayRecord");
}

/* ---- reading ---------------------------------------------------------------------- */

void fb_result_close(fb_result_view *v) {
    free(v->datum_at);
    memset(v, 0, sizeof *v);
}

static bool packed_finite(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(packed_get_f32(p + 4 * i))) return false;
    return true;
}

int fb_result_open(fb_result_view *v, const uint8_t *bin, size_t len, char *err, size_t errlen) {
    memset(v, 0, sizeof *v);
    if (!bin || len < HEAD || memcmp(bin, FB_RESULT_MAGIC, 4) != 0) {
        err_set(err, errlen, "result_bin is not a packed forward_backward result (%zu bytes, format %s)", len,
                FB_RESULT_MAGIC);
        return -1;
    }
    v->bin = bin;
    v->len = len;
    v->n_datums = packed_get_u32(bin + 4);
    v->n_metrics = packed_get_u32(bin + 8);
    if (v->n_metrics > (len - HEAD) / METRIC_SIZE || v->n_datums > len / 8) {
        err_set(err, errlen, "result_bin: %zu metrics and %zu datums do not fit its %zu bytes", v->n_metrics,
                v->n_datums, len);
        return -1;
    }
    for (size_t i = 0; i < v->n_metrics; i++) {
        fb_metric m = fb_result_metric(v, i);
        const uint8_t *k = bin + HEAD + i * METRIC_SIZE;
        bool ok = k[FB_METRIC_KEY_MAX - 1] == 0 && m.key[0] && isfinite(m.value);
        for (const char *c = m.key; *c && ok; c++) ok = *c > 0x20 && *c < 0x7f && *c != '"' && *c != '\\';
        if (!ok || (i && key_order(fb_result_metric(v, i - 1).key, m.key) >= 0)) {
            err_set(err, errlen, "result_bin: metric %zu is not a finite value under a printable key in key order", i);
            return -1;
        }
    }
    v->datum_at = malloc((v->n_datums ? v->n_datums : 1) * sizeof *v->datum_at);
    if (!v->datum_at) {
        err_set(err, errlen, "out of memory");
        return -1;
    }
    size_t at = HEAD + v->n_metrics * METRIC_SIZE;
    for (size_t d = 0; d < v->n_datums; d++) {
        if (len - at < 8) {
            err_set(err, errlen, "result_bin ends at datum %zu of %zu", d, v->n_datums);
            return -1;
        }
        uint64_t n = packed_get_u32(bin + at), k = packed_get_u32(bin + at + 4);
        if (k < 1 || n * (k + 1) > (len - at - 8) / 4) {
            err_set(err, errlen, "result_bin: datum %zu ([%llu, %llu]) does not fit its bytes", d,
                    (unsigned long long)n, (unsigned long long)k);
            return -1;
        }
        if (!packed_finite(bin + at + 8, n * (k + 1))) {
            err_set(err, errlen, "result_bin: datum %zu has a value that is not finite", d);
            return -1;
        }
        v->datum_at[d] = at;
        at += 8 + 4 * n * (k + 1);
    }
    if (at != len) {
        err_set(err, errlen, "result_bin has %zu bytes after its %zu datums", len - at, v->n_datums);
        return -1;
    }
    return 0;
}

fb_metric fb_result_metric(const fb_result_view *v, size_t i) {
    fb_metric m;
    const uint8_t *p = v->bin + HEAD + i * METRIC_SIZE;
    memcpy(m.key, p, FB_METRIC_KEY_MAX);
    m.key[FB_METRIC_KEY_MAX - 1] = 0;
    m.value = packed_get_f64(p + FB_METRIC_KEY_MAX);
    return m;
}

fb_output_packed fb_result_datum(const fb_result_view *v, size_t i) {
    const uint8_t *p = v->bin + v->datum_at[i];
    size_t n = packed_get_u32(p), k = packed_get_u32(p + 4);
    return (fb_output_packed){.n = n, .k = k, .logprobs = p + 8, .loss = p + 8 + 4 * n * k};
}

/* ---- the JSON the client receives --------------------------------------------------- */

void fb_json_real(char *out, size_t size, double v) {
    /* jansson's text at precision 9: "%.9g", and ".0" when it has neither '.' nor 'e' */
    char t[40];
    snprintf(t, sizeof t, "%.9g", v);
    const char *p = t;
    bool neg = *p == '-';
    p += neg;
    char digits[48];
    int nd = 0, point = -1, exp = 0;
    for (; *p && *p != 'e'; p++) {
        if (*p == '.') point = nd;
        else digits[nd++] = *p;
    }
    if (*p == 'e') exp = atoi(p + 1);
    else if (point < 0) digits[nd++] = '0', point = nd - 1;   /* "3" -> "3.0" */
    if (point < 0) point = nd;
    /* PostgreSQL's numeric: the digits with the point moved by the exponent, as many
     * decimals as the text had after its point less the exponent (at least 0) */
    int scale = nd - point - exp, at = point + exp;
    if (scale < 0) scale = 0;
    bool zero = true;
    for (int i = 0; i < nd; i++) zero &= digits[i] == '0';
    size_t o = 0;
    if (neg && !zero) out[o++] = '-';
    size_t int_start = o;
    for (int i = 0; i < at && o + 1 < size; i++) {
        char c = i < nd ? digits[i] : '0';
        if (c == '0' && o == int_start) continue;   /* leading zeros */
        out[o++] = c;
    }
    if (o == int_start && o + 1 < size) out[o++] = '0';
    if (scale > 0 && o + 1 < size) out[o++] = '.';
    for (int i = at; i < at + scale && o + 1 < size; i++) out[o++] = i >= 0 && i < nd ? digits[i] : '0';
    out[o] = 0;
}

static void put_real(strbuf *b, double v) {
    char t[FB_JSON_REAL_MAX];
    fb_json_real(t, sizeof t, v);
    sb_puts(b, t);
}

/* {"data": [...], "dtype": "float32", "shape": [n] or [n, k]} */
static void put_tensor(strbuf *b, const uint8_t *x, size_t n, size_t k) {
    sb_puts(b, "{\"data\": [");
    for (size_t i = 0; i < n * k; i++) {
        if (i) sb_puts(b, ", ");
        put_real(b, packed_get_f32(x + 4 * i));
    }
    if (k > 1) sb_printf(b, "], \"dtype\": \"float32\", \"shape\": [%zu, %zu]}", n, k);
    else sb_printf(b, "], \"dtype\": \"float32\", \"shape\": [%zu]}", n);
}

char *fb_result_json(const fb_result_view *v, size_t *len) {
    strbuf b;
    size_t values = 0;
    for (size_t d = 0; d < v->n_datums; d++) {
        fb_output_packed o = fb_result_datum(v, d);
        values += o.n * (o.k + 1);
    }
    sb_init(&b, 256 + 14 * values);   /* "-12.3456789, " */
    sb_puts(&b, "{\"metrics\": {");
    for (size_t i = 0; i < v->n_metrics; i++) {
        fb_metric m = fb_result_metric(v, i);
        sb_printf(&b, "%s\"%s\": ", i ? ", " : "", m.key);
        put_real(&b, m.value);
    }
    sb_puts(&b, "}, \"loss_fn_outputs\": [");
    for (size_t d = 0; d < v->n_datums; d++) {
        fb_output_packed o = fb_result_datum(v, d);
        sb_puts(&b, d ? ", {\"logprobs\": " : "{\"logprobs\": ");
        put_tensor(&b, o.logprobs, o.n, o.k);
        sb_puts(&b, ", \"elementwise_loss\": ");
        put_tensor(&b, o.loss, o.n, 1);
        sb_putc(&b, '}');
    }
    sb_puts(&b, "], \"loss_fn_output_type\": \"ArrayRecord\"}");
    return sb_steal(&b, len);
}
