/* api_routes.c: every path of the wire protocol (docs/protocol.md §1.4), with how Loom answers it. Paths not
 * in this table are 404, and so are the other methods on a path only a ROUTE_TODO or
 * ROUTE_MISSING entry names; a known path with another method is 405; ROUTE_TODO entries
 * answer 501 until implemented; ROUTE_MISSING entries, SDK methods Loom does not serve,
 * 404 naming the method. */
#include "api/api_routes.h"
#include "console/api_console.h"
#include "core/api_metrics.h"
#include "openai/api_openai.h"
#include "service/api_proto.h"
#include "tinker/api_session_futures.h"
#include "tinker/api_upload.h"
#include "tinker/api_weights.h"
#include "tinker/tinker.h"

/* client/config (docs/protocol.md §2.1); api_main.c rewrites it for --proto before any loop starts.
 * The sample_* flags turn on routes the SDK uses only when told: the per-session poll
 * (retrieve_futures, §4.4) and join_sampling_session for cloned samplers (§4.6). */
char api_client_config[512] = "{\"pjwt_auth_enabled\": false, \"use_pyqwest_transport\": false, "
                              API_CLIENT_CONFIG_SAMPLE_FLAGS "}";

#define V1 "/api/v1"
#define TODO(m, p) {m, V1 p, ROUTE_NO_AUTH | ROUTE_INLINE | ROUTE_TODO, NULL, NULL}
#define MISSING(m, p, sdk) {m, V1 p, ROUTE_NO_AUTH | ROUTE_INLINE | ROUTE_MISSING, NULL, sdk}

/* A route names its hooks (core/api_route.h) by designator; the routes without them leave
 * those fields out, zero. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const api_route routes[] = {
    /* bootstrap (§2): static answers, no key needed */
    /* liveness: the process and its event loops answer (no database needed) */
    {"GET", V1 "/healthz", ROUTE_NO_AUTH | ROUTE_INLINE, NULL, "{\"status\": \"ok\"}"},
    /* readiness: the database answers and which base models a live executor serves */
    {"GET", V1 "/readyz", ROUTE_NO_AUTH | ROUTE_DB_OPTIONAL, api_h_readyz, NULL},
    {"POST", V1 "/client/config", ROUTE_NO_AUTH | ROUTE_INLINE, NULL, api_client_config},
    {"GET", V1 "/client/config", ROUTE_NO_AUTH | ROUTE_INLINE, NULL, api_client_config},
    /* sample_cancel_enabled: abandoned samples are sent to cancel_future (§4.5) */
    {"POST", V1 "/client/dynamic_config", ROUTE_NO_AUTH | ROUTE_INLINE, NULL,
     "{\"refresh_interval_sec\": 300, \"sample_cancel_enabled\": true}"},
    {"GET", V1 "/get_server_capabilities", 0, api_h_capabilities, NULL},
    {"POST", V1 "/get_server_capabilities", ROUTE_READ, api_h_capabilities, NULL},
    /* telemetry (§13): any valid key (the SDK sends X-API-Key on every request); any body
     * is accepted, and while the database is away (no key can be checked) dropped */
    {"POST", V1 "/telemetry", ROUTE_READ | ROUTE_RAW_BODY | ROUTE_DB_OPTIONAL, api_h_telemetry, NULL},

    /* sessions (§3) */
    {"POST", V1 "/create_session", ROUTE_READ, api_h_create_session, NULL},
    {"POST", V1 "/session_heartbeat", ROUTE_READ, api_h_session_heartbeat, NULL},
    {"POST", V1 "/create_sampling_session", ROUTE_SAMPLE, api_h_create_sampling_session, NULL},
    {"GET", V1 "/samplers/+", 0, api_h_get_sampler, NULL},

    /* futures (§4) */
    {"POST", V1 "/retrieve_future", ROUTE_LONG_POLL | ROUTE_READ, api_h_retrieve_future, NULL,
     .from_note = api_future_from_note, .first_look = api_future_first_look},
    /* per sampling session (§4.4-§4.6): api_session_futures.c */
    {"POST", V1 "/retrieve_futures", ROUTE_LONG_POLL | ROUTE_READ, api_h_retrieve_futures, NULL},
    {"POST", V1 "/cancel_future", ROUTE_SAMPLE, api_h_cancel_future, NULL},
    {"POST", V1 "/join_sampling_session", ROUTE_SAMPLE, api_h_join_sampling_session, NULL},

    /* training (§7) */
    {"POST", V1 "/create_model", 0, api_h_create_model, NULL},
    {"POST", V1 "/get_info", ROUTE_READ, api_h_get_info, NULL},
    {"POST", V1 "/forward_backward", 0, api_h_forward_backward, NULL, .proto_budget = proto_decode_budget},
    {"POST", V1 "/forward", 0, api_h_forward, NULL},
    {"POST", V1 "/optim_step", 0, api_h_optim_step, NULL},
    /* the unnamed form (no path) is ours; the named form goes to api_weights.c */
    {"POST", V1 "/save_weights_for_sampler", 0, api_h_save_weights_for_sampler, NULL},
    {"POST", V1 "/unload_model", 0, api_h_unload_model, NULL},

    /* sampling (§11) */
    {"POST", V1 "/asample", ROUTE_SAMPLE, api_h_asample, NULL},
    {"POST", V1 "/sample", ROUTE_SAMPLE, api_h_asample, NULL},

    /* the tenant's own usage, limits and live work (docs/operating.md "Quotas and usage") */
    {"GET", V1 "/usage", 0, api_h_usage, NULL},
    {"GET", V1 "/billing/usage/checkpoints/current", 0, api_h_checkpoint_storage_current, NULL},

    /* REST reads (§12.2) other than checkpoints */
    {"GET", V1 "/sessions", 0, api_h_list_sessions, NULL},
    {"GET", V1 "/sessions/+", 0, api_h_get_session, NULL},
    /* ServiceClient.close: any key, like the heartbeat */
    {"POST", V1 "/sessions/+/finish", ROUTE_READ, api_h_session_finish, NULL},
    /* RestClient.assign_session_project */
    {"PUT", V1 "/sessions/+/project", 0, api_h_session_project, NULL},
    {"GET", V1 "/training_runs", 0, api_h_list_training_runs, NULL},
    {"GET", V1 "/training_runs/+", 0, api_h_get_training_run, NULL},

    /* checkpoints and the registry (§7.6, §7.7, §12.2, §17): api_weights.c */
    {"POST", V1 "/save_weights", 0, api_h_save_weights, NULL},
    {"POST", V1 "/save_weights_external", 0, api_h_save_weights_external, NULL},
    {"POST", V1 "/copy_weights", 0, api_h_copy_weights, NULL},
    {"POST", V1 "/load_weights", 0, api_h_load_weights, NULL},
    {"POST", V1 "/weights_info", ROUTE_READ, api_h_weights_info, NULL},
    {"GET", V1 "/checkpoints", 0, api_h_list_checkpoints, NULL},
    {"POST", V1 "/checkpoints/search", ROUTE_READ, api_h_search_checkpoints, NULL},
    {"GET", V1 "/training_runs/*", 0, api_h_run_checkpoints_get, NULL},
    {"POST", V1 "/training_runs/*", 0, api_h_run_checkpoints_post, NULL},
    {"PUT", V1 "/training_runs/*", 0, api_h_run_checkpoints_put, NULL},
    {"DELETE", V1 "/training_runs/*", 0, api_h_run_checkpoints_delete, NULL},
    {"GET", V1 "/models/*", 0, api_h_models_checkpoints, NULL},
    {"GET", V1 "/checkpoint_archives/*", ROUTE_NO_AUTH, api_h_checkpoint_download, NULL},
    /* adapter uploads (§12.7): api_upload.c; the PUT's body is staged by the loop */
    {"POST", V1 "/external_weights_upload_start", 0, api_h_upload_start, NULL},
    {"POST", V1 "/external_weights_upload_finish", 0, api_h_upload_finish, NULL},
    {"PUT", V1 "/external_weights_uploads/*", ROUTE_NO_AUTH | ROUTE_RAW_BODY, api_h_upload_put, NULL,
     .stage = api_upload_stage},

    /* the OpenAI-compatible routes (§18): api_openai.c; the aliases they take as models */
    {"GET", "/v1/models", 0, api_h_oai_models, NULL, .errors = &oai_error_shape},
    {"GET", "/v1/models/*", 0, api_h_oai_model, NULL, .errors = &oai_error_shape},
    {"POST", "/v1/completions", ROUTE_SAMPLE, api_h_oai_completions, NULL, .errors = &oai_error_shape},
    {"POST", "/v1/chat/completions", ROUTE_SAMPLE, api_h_oai_chat, NULL, .errors = &oai_error_shape},
    {"GET", V1 "/aliases", 0, api_h_aliases_list, NULL},
    {"PUT", V1 "/aliases/+", 0, api_h_alias_put, NULL},
    {"DELETE", V1 "/aliases/+", 0, api_h_alias_delete, NULL},

    /* observability (docs/operating.md "Metrics", docs/using.md "Web console"): the console's files, its read-only
     * JSON (tenant-scoped like every route; /console/admin/ needs an operator key) */
    {"GET", "/metrics", ROUTE_METRICS, api_h_metrics, NULL},
    {"GET", "/", ROUTE_NO_AUTH, NULL, NULL, .serve = api_console_static},
    {"GET", "/console", ROUTE_NO_AUTH, NULL, NULL, .serve = api_console_static},
    {"GET", "/console/", ROUTE_NO_AUTH, NULL, NULL, .serve = api_console_static},
    {"GET", "/console/+", ROUTE_NO_AUTH, NULL, NULL, .serve = api_console_static},
    {"GET", V1 "/console/whoami", ROUTE_ANY_KEY, api_h_console_whoami, NULL},
    {"GET", V1 "/console/runs", 0, api_h_console_runs, NULL},
    {"GET", V1 "/console/runs/+", 0, api_h_console_run, NULL},
    {"GET", V1 "/console/checkpoints", 0, api_h_console_checkpoints, NULL},
    {"GET", V1 "/console/download_link", 0, api_h_console_download_link, NULL},
    {"POST", V1 "/console/tokenize", ROUTE_READ, api_h_console_tokenize, NULL},
    {"POST", V1 "/console/detokenize", ROUTE_READ, api_h_console_detokenize, NULL},
    {"GET", V1 "/console/admin/overview", ROUTE_ADMIN, api_h_console_admin_overview, NULL},
    {"GET", V1 "/console/admin/cycles", ROUTE_ADMIN, api_h_console_admin_cycles, NULL},

    /* not implemented yet */
    TODO("POST", "/auth/token"),
    /* SDK 0.38 methods Loom does not serve (README.md, "Not implemented") */
    MISSING("POST", "/sessions/search", "RestClient.search_sessions"),
    MISSING("GET", "/sessions/+/trace_export", "RestClient.export_session_trace"),
    MISSING("GET", "/billing/usage/events", "RestClient.get_billing_usage"),
    MISSING("GET", "/audit", "RestClient.get_audit_log"),
};
#pragma GCC diagnostic pop

/* Requests under /v1/ that no route answers get OpenAI's error shape too. */
static const api_error_shape *const shapes[] = {&oai_error_shape, NULL};

const api_route_table api_routes = {routes, sizeof routes / sizeof routes[0], shapes};
