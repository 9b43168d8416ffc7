/* api_main.c: `loom api` options and start-up: secret, database workers, event loops,
 * the LISTEN thread, then the one stdout line `loom up` waits for. */
#include "api/api.h"
#include "api/api_routes.h"
#include "common/config.h"
#include "common/keys.h"
#include "common/log.h"
#include "contract/contract.h"
#include "core/api_auth.h"
#include "core/api_json.h"
#include "core/api_listen.h"
#include "tinker/api_futures_cache.h"
#include "core/api_metrics.h"
#include "core/api_pool.h"
#include "core/http_server.h"
#include "openai/api_openai.h"
#include "tinker/api_state.h"
#include "tinker/api_upload.h"
#include <jansson.h>
#include <malloc.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What `loom up` passes through to its api (cli/up.c). */
const opt_spec API_TUNING_OPTS[] = {
    {.name = "db-workers", .kind = OPT_INT, .arg = "N", .lo = 1, .hi = 1024,
     .help = "database worker threads, one connection each (default 2 x threads, at least 4)"},
    {.name = "max-body-mb", .kind = OPT_INT, .arg = "N", .def = "64", .lo = 1, .hi = 4096,
     .help = "largest request body in MiB"},
    {.name = "max-inflight-mb", .kind = OPT_INT, .arg = "N", .def = "512", .lo = 1, .hi = 1 << 20,
     .help = "MiB of request bodies the api holds at once, from their headers until they are answered; more "
             "answer 503 (Retry-After: 1)"},
    {.name = "max-inflight-mb-per-key", .kind = OPT_INT, .arg = "N", .def = "128", .lo = 1, .hi = 1 << 20,
     .help = "... of one API key; more answer 429 (Retry-After: 1)"},
    {.name = "max-decode-mb", .kind = OPT_INT, .arg = "N", .def = "1024", .lo = 16, .hi = 1 << 20,
     .help = "MiB that decoding request bodies (zstd, JSON parse trees) may take at once; a body that would "
             "need more than that answers 413, one that would need more than is left now 503"},
    {.name = "tls-cert", .kind = OPT_STR, .arg = "FILE", .help = "serve HTTPS (HTTP/1.1) with this certificate..."},
    {.name = "tls-key", .kind = OPT_STR, .arg = "FILE", .help = "... and this key"},
    {.name = "path-prefix", .kind = OPT_STR, .arg = "/X", .help = "also serve the API under /X/api/v1/..."},
    {.name = "max-queued-samples", .kind = OPT_INT, .arg = "N", .def = "1000", .lo = 0, .hi = 100000000,
     .help = "asample answers 429 (Retry-After: 1) while the tenant has more than N samples queued"},
    {.name = "max-streams", .kind = OPT_INT, .arg = "N", .def = "128", .lo = 1, .hi = 1000000,
     .help = "OpenAI requests (/v1/...) a tenant may have in flight; more answer 429"},
    {.name = "openai-max-tokens", .kind = OPT_INT, .arg = "N", .def = "4096", .lo = 1, .hi = 1 << 24,
     .help = "the largest max_tokens an OpenAI request may ask for"},
    {.name = "storage-usd-per-gb-month", .kind = OPT_STR, .arg = "USD", .def = "0",
     .help = "checkpoint storage price per GB-month that billing/usage/checkpoints/current reports (0: free)"},
    {.name = "proto", .kind = OPT_FLAG,
     .help = "client/config asks SDKs 0.19-0.24 to send forward_backward (and forward) as protobuf"},
    {.name = "proto-compress", .kind = OPT_FLAG, .help = "... zstd-compressed (implies --proto)"},
    {0}};

static const opt_spec API_OPTS[] = {
    {.name = "host", .kind = OPT_STR, .arg = "H", .def = "127.0.0.1", .help = "address to listen on"},
    {.name = "port", .kind = OPT_INT, .arg = "N", .def = "8000", .lo = 0, .hi = 65535,
     .help = "port; 0 picks a free one"},
    {.name = "threads", .kind = OPT_INT, .arg = "N", .def = "2", .lo = 1, .hi = 256, .help = "event-loop threads"},
    {0}};

static const cfg_cmd API_CMD = {
    .cmd = "loom api", .section = "api",
    .about = "The HTTP front end (Tinker API). Prints 'LOOM_API_LISTENING port=<n>' on stdout once\n"
             "listening; logs go to stderr.",
    .tables = {CFG_DB, API_OPTS, API_TUNING_OPTS, CFG_EXECUTOR_TIMEOUT, CFG_DATA_DIR, CFG_SECRET, CFG_BLOBS}};

int api_main(int argc, char **argv) {
    cfg o;
    int rc;
    if (!cfg_parse(&API_CMD, argc, argv, &o, &rc)) return rc;
    if ((cfg_str(&o, "tls-cert") != NULL) != (cfg_str(&o, "tls-key") != NULL))
        return cfg_usage_error(&API_CMD, "--tls-cert and --tls-key go together");
    http_conf hc = {.host = cfg_str(&o, "host"), .port = (int)cfg_int(&o, "port"), .nthreads = (int)cfg_int(&o, "threads"),
                    .prefix = cfg_str(&o, "path-prefix") ? cfg_str(&o, "path-prefix") : "",
                    .tls_cert = cfg_str(&o, "tls-cert"), .tls_key = cfg_str(&o, "tls-key"),
                    .routes = &api_routes, .signed_body = api_upload_gate_check};
    int workers = (int)cfg_int(&o, "db-workers"), max_body_mb = (int)cfg_int(&o, "max-body-mb"),
        max_queued = (int)cfg_int(&o, "max-queued-samples"), max_streams = (int)cfg_int(&o, "max-streams"),
        oai_max_tokens = (int)cfg_int(&o, "openai-max-tokens"),
        executor_timeout_s = (int)cfg_int(&o, "executor-timeout-s");
    bool proto_zstd = cfg_flag(&o, "proto-compress"), proto = proto_zstd || cfg_flag(&o, "proto");
    char *price_end;
    const char *price_text = cfg_str(&o, "storage-usd-per-gb-month");
    double storage_price = strtod(price_text, &price_end);
    if (!*price_text || *price_end || !(storage_price >= 0 && storage_price <= 1e6))
        return cfg_usage_error(&API_CMD, "--storage-usd-per-gb-month must be a price from 0 to 1000000");
    char db[4096], db_from[4600], blob_dir[4096];
    cfg_db(&o, db, sizeof db, db_from, sizeof db_from);
    cfg_blob_dir(&o, blob_dir, sizeof blob_dir);
    hc.max_body = (size_t)max_body_mb << 20;
    hc.inflight_total = (size_t)cfg_int(&o, "max-inflight-mb") << 20;
    hc.inflight_per_key = (size_t)cfg_int(&o, "max-inflight-mb-per-key") << 20;
    if (!workers) workers = hc.nthreads * 2 < 4 ? 4 : hc.nthreads * 2;

    /* jansson seeds its hash function on first use, and takes its allocator once; both
     * before any thread exists. */
    json_object_seed(0);
    jx_init((size_t)cfg_int(&o, "max-decode-mb") << 20);
    /* Request bodies and their copies (up to --max-body-mb) are mapped on their own and
     * go back to the system when freed: glibc would otherwise raise this threshold as they
     * are freed and keep their memory in its heaps (2.6 GB stayed held after four 33 MB
     * bodies). The parse trees' small blocks are trimmed after large requests. */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    /* A client that disconnects mid-write must not kill the process. */
    signal(SIGPIPE, SIG_IGN);
    char err[1024];
    api_pool_conf pc = {.conninfo = db, .nworkers = workers, .max_queue = 10000,
                        .settings = {.max_queued_samples = max_queued, .max_body = hc.max_body,
                                     .max_streams = max_streams, .openai_max_tokens = oai_max_tokens,
                                     .executor_timeout_s = executor_timeout_s,
                                     .storage_usd_per_gb_month = storage_price}};
    if (proto)
        snprintf(api_client_config, sizeof api_client_config,
                 "{\"pjwt_auth_enabled\": false, \"use_pyqwest_transport\": false, "
                 "\"proto_write_fwdbwd\": true, \"fwd_via_fwdbwd\": true, "
                 "\"proto_compress_fwdbwd\": %s, " API_CLIENT_CONFIG_SAMPLE_FLAGS "}", proto_zstd ? "true" : "false");
    if (keys_init() < 0) {
        log_error("libsodium initialisation failed");
        return 1;
    }
    if (cfg_secret(&o, false, pc.secret, err, sizeof err) < 0) {
        log_error("%s", err);
        return 1;
    }
    if (api_state_init(pc.secret, blob_dir, err, sizeof err) < 0) {
        log_error("blob store %s: %s", blob_dir, err);
        return 1;
    }
    char spool[4200];
    snprintf(spool, sizeof spool, "%s/tmp", blob_dir);
    if (blob_dir[0]) hc.spool_dir = spool;
    api_pool *pool = api_pool_start(&pc, 30000, err, sizeof err);
    if (!pool) {
        log_error("cannot connect to the database (%s): %s", db_from, err);
        return 1;
    }
    api_metrics_init(&api_routes);
    if (api_metrics_start_folding(db, err, sizeof err) < 0) {
        log_error("%s", err);
        return 1;
    }
    /* The OpenAI routes answer their completions on the loops (openai/api_openai_stream.c). */
    http_loop_ext_add(&oai_loop_ext);
    int port;
    if (http_server_start(&hc, pool, &port, err, sizeof err) < 0) {
        log_error("%s", err);
        return 1;
    }
    /* One listening connection: PostgreSQL wakes each on every NOTIFY of the database. */
    static const api_listen_chan chans[] = {
        /* the futures cache first: a loop woken for a result finds it there */
        {CHAN_OP_DONE, fut_cache_noted, NULL},
        {CHAN_OP_DONE, http_server_notify, NULL},
        {CHAN_SAMPLE_PROGRESS, oai_progress, NULL},
        {CHAN_API_KEYS, api_auth_cache_flush, NULL},
    };
    if (api_listen_start(db, chans, (int)(sizeof chans / sizeof chans[0]), err, sizeof err) < 0) {
        log_error("%s", err);
        return 1;
    }
    printf("LOOM_API_LISTENING port=%d\n", port);
    fflush(stdout);
    log_info("listening on %s://%s:%d%s/api/v1 (%d loop threads, %d database workers, "
             "max body %d MiB)", hc.tls_cert ? "https" : "http", hc.host, port, hc.prefix,
             hc.nthreads, workers, max_body_mb);
    http_server_join();
    return 1;
}
