/* api_console.h: the web console (docs/using.md "Web console"): its files, served by the event
 * loop from the copies compiled into the binary (the files of console/, embedded at build time, so it
 * works offline), and the read-only JSON routes its pages read. The key never travels in
 * a URL: the page keeps it in sessionStorage and sends it as X-API-Key. */
#pragma once
#include "core/api_call.h"
#include "core/api_route.h"
#include <stddef.h>

/* The answer for a path of the console's files ("/", "/console", "/console/", "/console/<file>"):
 * the serve hook of those routes (core/api_route.h), called on the event loop. */
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
