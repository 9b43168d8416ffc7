/* tinker.h: the Tinker routes' handlers (docs/protocol.md §2-§13; api/api_routes.c
 * registers them) and what several of them share about sessions. The checkpoint
 * routes are in api_weights.h, adapter uploads in api_upload.h, the per-session futures
 * in api_session_futures.h. */
#pragma once
#include "core/api_call.h"
#include <stddef.h>

/* Inside a transaction: locks the tenant's session (it serialises seq_id allocation in the
 * session) and counts the submit as its sign of life. 0 when it is there and live; 1 when
 * the answer (404 unknown, 400 expired or finished) is given and the transaction rolled
 * back; -1 on a database error (err in c->err). */
int api_session_lock(api_call *c, const char *session_id);

/* "session S finished (reason) ...": the message of a request bound to a session its
 * client finished (sessions/{id}/finish), which takes no more requests. */
void api_session_finished_msg(char *out, size_t outlen, const char *session_id, const char *reason);

/* Route handlers (api_session.c, api_usage.c, api_training.c, api_futures.c,
 * api_sampling.c, api_rest.c). */
int api_h_create_session(api_call *c);
int api_h_session_heartbeat(api_call *c);
int api_h_session_finish(api_call *c);   /* POST sessions/{id}/finish */
int api_h_session_project(api_call *c);  /* PUT sessions/{id}/project */
int api_h_capabilities(api_call *c);
int api_h_readyz(api_call *c);
int api_h_usage(api_call *c);
int api_h_checkpoint_storage_current(api_call *c);   /* GET billing/usage/checkpoints/current */
int api_h_telemetry(api_call *c);
int api_h_create_model(api_call *c);
int api_h_get_info(api_call *c);
int api_h_forward_backward(api_call *c);
int api_h_forward(api_call *c);
int api_h_optim_step(api_call *c);
int api_h_retrieve_future(api_call *c);
int api_future_from_note(api_call *c, const char *note);   /* api_route.from_note */
int api_future_first_look(api_call *c);                     /* api_route.first_look */
int api_h_create_sampling_session(api_call *c);
int api_h_get_sampler(api_call *c);
int api_h_save_weights_for_sampler(api_call *c);
int api_h_asample(api_call *c);
int api_h_unload_model(api_call *c);
int api_h_list_sessions(api_call *c);
int api_h_get_session(api_call *c);
int api_h_list_training_runs(api_call *c);
int api_h_get_training_run(api_call *c);
