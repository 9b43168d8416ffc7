/* api_routes.h: the api's route table (paths after the optional prefix): every route of
 * the route rooms (tinker/, openai/, console/), with the hooks that say how each is
 * answered (core/api_route.h). Each route is answered either on the event loop (static
 * answers, 501s, the console's files) or by a database worker running its handler.
 * Nothing but the api's main (api_main.c) uses it. */
#pragma once
#include "core/api_route.h"

/* The table, for the event loops and the per-route metrics. */
extern const api_route_table api_routes;

/* The client/config answer (a NUL-terminated JSON object). */
extern char api_client_config[512];
/* Its flags of the sampling routes (one place for both forms of the answer). */
#define API_CLIENT_CONFIG_SAMPLE_FLAGS "\"sample_use_retrieve_futures\": true, \"sample_join_sampling_session\": true"
