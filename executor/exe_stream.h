/* exe_stream.h: streaming (docs/architecture.md "Streaming", docs/protocol.md §18.5). The
 * tokens of sample operations whose payload asks for progress ("progress": true: the
 * OpenAI routes) leave the executor while the batch still decodes: the backend tells
 * exe_stream_on_token about every token (a few atomic stores, no lock, no I/O), and one
 * publisher thread per process, with its own PostgreSQL connection, sends what is new at
 * most every STREAM_TICK_MS as NOTIFY CHAN_SAMPLE_PROGRESS payloads. The decode loop never
 * waits for the publisher or the database: a slow or broken connection only drops
 * progress, and the api then takes the tokens from the committed result.
 *
 * The same thread LISTENs CHAN_SAMPLE_CANCEL: a request whose client went away ends its
 * samples at their next token (exe_stream_on_token returns true). */
#pragma once
#include "executor/exe_ops.h"

typedef struct exe_stream_op exe_stream_op;

/* Follows one sample operation: its outputs (tokens, logprobs [num_samples, max_tokens],
 * top_ids / top_lp [num_samples, max_tokens, top_k] or NULL), which must stay valid until
 * exe_stream_untrack. Set the request's on_token = exe_stream_on_token and on_token_user to
 * the handle. NULL when progress cannot be published (the publisher could not start). */
exe_stream_op *exe_stream_track(exe_state *st, const char *request_id, int num_samples, int max_tokens,
                                const int32_t *tokens, const float *logprobs, int top_k, const int32_t *top_ids,
                                const float *top_lp);
/* The backend's on_token callback (backend.h): records the sample's progress. */
bool exe_stream_on_token(const be_sample_req *r, int sample, int n, bool done);
/* After the backend calls: queues what was not published yet (n_out, stopped: the final
 * outputs; NULL when the operation failed: nothing more is sent) and stops following
 * the operation. o may be NULL. */
void exe_stream_untrack(exe_stream_op *o, const int *n_out, const bool *stopped);
/* Whether the operation's client went away (its samples were ended early). */
bool exe_stream_canceled(const exe_stream_op *o);
