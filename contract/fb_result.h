/* fb_result.h: the result of a forward / forward_backward on its way from the executor to
 * the client, in one codec that both use.
 *
 * The executor encodes its outputs (exe_train.c) into two columns of the operations row:
 *   operations.result      a JSON header for SQL (operations.metrics, the registry's
 *                          provenance, loss curves): {"metrics": {...}, "loss_fn_output_type":
 *                          "ArrayRecord"} (fb_result_header)
 *   operations.result_bin  the metrics and every datum's outputs, packed (below)
 * and the api answers retrieve_future from result_bin alone (binary libpq parameter and
 * result: no text on the way): fb_result_json writes the JSON the client receives,
 * service/api_proto.c the ForwardBackwardOutput (SDK 0.25+), without a JSON text between.
 *
 * The JSON is byte for byte what clients got when the whole result was stored as jsonb
 * (before migration 0028): the executor's jansson text (reals at 9 significant digits)
 * printed back by PostgreSQL (keys in jsonb's order, ", " and ": ", numbers as numeric
 * prints them: no exponent, the written scale, no negative zero). tests/test_fb_codec.c
 * holds the renderer to PostgreSQL's own output.
 *
 * result_bin, little-endian:
 *   "LFR1"  u32 datums  u32 metrics  u32 0
 *   per metric, in jsonb's key order (shorter first, then bytewise), no repeats:
 *     char key[32] (NUL-padded)  f64 value (at 9 significant digits: what clients see)
 *   per datum: u32 n  u32 k (columns of logprobs: 1, or K of a 2-D cross_entropy)
 *              f32 logprobs[n·k]  f32 elementwise_loss[n]
 * Values are finite. */
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FB_RESULT_MAGIC "LFR1"
#define FB_METRIC_KEY_MAX 32   /* bytes of a metric's key, its NUL included */

typedef struct {
    char key[FB_METRIC_KEY_MAX];
    double value;
} fb_metric;

/* One datum's outputs: logprobs [n, k] (row-major; k 1: [n]) and the per-token loss [n]. */
typedef struct {
    size_t n, k;
    const float *logprobs, *loss;
} fb_output;

/* ---- the executor's side ------------------------------------------------------------ */

/* v as clients see it: rounded to 9 significant digits. */
double fb_result_round(double v);
/* result_bin (malloc'd, *len bytes) of the metrics (any order; keys shorter than
 * FB_METRIC_KEY_MAX) and outputs; NULL when a value is not finite, a key repeats or is too
 * long, or memory is short. */
uint8_t *fb_result_encode(const fb_metric *metrics, size_t n_metrics, const fb_output *out, size_t n_out,
                          size_t *len);
/* The JSON header of operations.result for the same metrics (a new reference). */
json_t *fb_result_header(const fb_metric *metrics, size_t n_metrics);

/* ---- the api's side ------------------------------------------------------------------- */

typedef struct {
    const uint8_t *bin;   /* result_bin, which must outlive the view */
    size_t len;
    size_t n_metrics, n_datums;
    size_t *datum_at;     /* offset of each datum (malloc'd) */
} fb_result_view;

/* One datum's outputs in place: little-endian float32 bytes, any alignment. */
typedef struct {
    size_t n, k;
    const uint8_t *logprobs, *loss;   /* n·k and n values */
} fb_output_packed;

/* Checks the whole of result_bin (sizes, key order, finite values). 0, or -1 with err.
 * fb_result_close frees the view (also after a failed open). */
int fb_result_open(fb_result_view *v, const uint8_t *bin, size_t len, char *err, size_t errlen);
void fb_result_close(fb_result_view *v);
fb_metric fb_result_metric(const fb_result_view *v, size_t i);
fb_output_packed fb_result_datum(const fb_result_view *v, size_t i);
/* The JSON the client receives (malloc'd, NUL-terminated, *len bytes). */
char *fb_result_json(const fb_result_view *v, size_t *len);
/* v as PostgreSQL prints the jsonb of jansson's text of it at 9 significant digits (the
 * numbers of fb_result_json). v finite. */
void fb_json_real(char *out, size_t n, double v);
#define FB_JSON_REAL_MAX 400   /* bytes fb_json_real may write, NUL included */
