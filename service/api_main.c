/* api_main.c: `loom api` options and start-up: secret, database workers, event loops,
 * the LISTEN thread, then the one stdout line `loom up` waits for. */
#include "service/api.h"
#include "common/keys.h"
#include "common/log.h"
#include "service/api_json.h"
#include "service/api_listen.h"
#include "service/api_metrics.h"
#include "service/api_pool.h"
#include "service/api_routes.h"
#include "service/api_sql.h"
#include "service/api_weights.h"
#include "service/http_server.h"
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: loom api --db CONNINFO --secret-file PATH [options]\n"
            "  --db CONNINFO        PostgreSQL connection string (default: $DATABASE_URL)\n"
            "  --host H             address to listen on (default 127.0.0.1)\n"
            "  --port N             port (default 8000; 0 = any free port)\n"
            "  --threads N          event-loop threads (default 2)\n"
            "  --db-workers N       database worker threads, one connection each\n"
            "                       (default 2 x threads, at least 4)\n"
            "  --secret-file PATH   server secret for API key hashes ($LOOM_SECRET overrides)\n"
            "  --max-body-mb N      largest request body in MiB (default 64)\n"
            "  --tls-cert F --tls-key F   serve HTTPS (HTTP/2 via ALPN)\n"
            "  --path-prefix /x     also serve the API under /x/api/v1/...\n"
            "  --max-queued-samples N  asample answers 429 (Retry-After: 1) while the tenant\n"
            "                       has more than N sample operations queued (default 1000)\n"
            "  --proto              client/config asks SDKs 0.19-0.24 to send forward_backward\n"
            "                       (and forward) as protobuf (proto_write_fwdbwd, fwd_via_fwdbwd)\n"
            "  --proto-compress     ... and to zstd-compress it (proto_compress_fwdbwd)\n"
            "  --blob-dir DIR       registry blob store (checkpoint archive downloads)\n"
            "Prints 'LOOM_API_LISTENING port=<n>' on stdout once listening; logs go to stderr.\n");
}

static int parse_int(const char *s, const char *name, int lo, int hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) {
        fprintf(stderr, "loom api: %s must be an integer in [%d, %d], got '%s'\n", name, lo, hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int api_main(int argc, char **argv) {
    enum { O_DB = 1, O_HOST, O_PORT, O_THREADS, O_WORKERS, O_SECRET, O_MAXBODY, O_CERT, O_KEY,
           O_PREFIX, O_MAXQ, O_PROTO, O_PROTO_ZSTD, O_BLOBS, O_HELP };
    static const struct option opts[] = {
        {"db", required_argument, 0, O_DB},
        {"host", required_argument, 0, O_HOST},
        {"port", required_argument, 0, O_PORT},
        {"threads", required_argument, 0, O_THREADS},
        {"db-workers", required_argument, 0, O_WORKERS},
        {"secret-file", required_argument, 0, O_SECRET},
        {"max-body-mb", required_argument, 0, O_MAXBODY},
        {"tls-cert", required_argument, 0, O_CERT},
        {"tls-key", required_argument, 0, O_KEY},
        {"path-prefix", required_argument, 0, O_PREFIX},
        {"max-queued-samples", required_argument, 0, O_MAXQ},
        {"proto", no_argument, 0, O_PROTO},
        {"proto-compress", no_argument, 0, O_PROTO_ZSTD},
        {"blob-dir", required_argument, 0, O_BLOBS},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    const char *db = getenv("DATABASE_URL"), *secret_file = NULL, *blob_dir = NULL;
    http_conf hc = {.host = "127.0.0.1", .port = 8000, .nthreads = 2, .prefix = ""};
    int workers = 0, max_body_mb = 64, max_queued = 1000;
    bool proto = false, proto_zstd = false;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_DB: db = optarg; break;
        case O_HOST: hc.host = optarg; break;
        case O_PORT: if (parse_int(optarg, "--port", 0, 65535, &hc.port) < 0) return 2; break;
        case O_THREADS: if (parse_int(optarg, "--threads", 1, 256, &hc.nthreads) < 0) return 2; break;
        case O_WORKERS: if (parse_int(optarg, "--db-workers", 1, 1024, &workers) < 0) return 2; break;
        case O_SECRET: secret_file = optarg; break;
        case O_MAXBODY: if (parse_int(optarg, "--max-body-mb", 1, 4096, &max_body_mb) < 0) return 2; break;
        case O_CERT: hc.tls_cert = optarg; break;
        case O_KEY: hc.tls_key = optarg; break;
        case O_PREFIX: hc.prefix = optarg; break;
        case O_MAXQ: if (parse_int(optarg, "--max-queued-samples", 0, 100000000, &max_queued) < 0) return 2; break;
        case O_PROTO: proto = true; break;
        case O_PROTO_ZSTD: proto = proto_zstd = true; break;
        case O_BLOBS: blob_dir = optarg; break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "loom api: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (!db) {
        fprintf(stderr, "loom api: pass --db CONNINFO or set DATABASE_URL\n");
        return 2;
    }
    hc.max_body = (size_t)max_body_mb << 20;
    if (!workers) workers = hc.nthreads * 2 < 4 ? 4 : hc.nthreads * 2;

    /* jansson seeds its hash function on first use, and takes its allocator once; both
     * before any thread exists. */
    json_object_seed(0);
    jx_init();
    /* A client that disconnects mid-write must not kill the process. */
    signal(SIGPIPE, SIG_IGN);
    char err[1024];
    api_pool_conf pc = {.conninfo = db, .nworkers = workers, .max_queue = 10000,
                        .settings = {.max_queued_samples = max_queued, .max_body = hc.max_body}};
    if (proto)
        snprintf(api_client_config, sizeof api_client_config,
                 "{\"pjwt_auth_enabled\": false, \"use_pyqwest_transport\": false, "
                 "\"proto_write_fwdbwd\": true, \"fwd_via_fwdbwd\": true, "
                 "\"proto_compress_fwdbwd\": %s}", proto_zstd ? "true" : "false");
    if (keys_init() < 0) {
        log_error("libsodium initialisation failed");
        return 1;
    }
    if (keys_load_secret(secret_file, false, pc.secret, err, sizeof err) < 0) {
        log_error("%s", err);
        return 1;
    }
    if (api_weights_init(pc.secret, blob_dir, err, sizeof err) < 0) {
        log_error("blob store %s: %s", blob_dir, err);
        return 1;
    }
    api_pool *pool = api_pool_start(&pc, 30000, err, sizeof err);
    if (!pool) {
        log_error("cannot connect to the database: %s", err);
        return 1;
    }
    api_metrics_init();
    if (api_metrics_start_folding(db, err, sizeof err) < 0) {
        log_error("%s", err);
        return 1;
    }
    int port;
    if (http_server_start(&hc, pool, &port, err, sizeof err) < 0) {
        log_error("%s", err);
        return 1;
    }
    if (api_listen_start(db, SQL_LISTEN_OP_DONE, http_server_notify, NULL, err, sizeof err) < 0) {
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
