/* api_futures_cache.h: what this api process knows of recent operations without reading
 * their rows, so that retrieve_future's first look costs no statement in the common cases
 * (docs/architecture.md, "Processes"): an operation it submitted itself is pending until its
 * loom_op_done; one whose loom_op_done carried the result (contract.h CHAN_OP_DONE, from
 * any api's submit) is done, and the note is its answer. Anything else, and every later
 * look of a long poll, reads the row: the cache only ever saves a lookup, it never decides
 * an answer the row would not give (a finished result is final; a pending entry parks the
 * request for at most the loop's 1 s re-check, which reads the row). Bounded: one slot per
 * bucket of the request_id's hash (FUT_SLOTS), a newer entry replacing an older one, each
 * note at most CHAN_OP_DONE's payload (under 8000 bytes). Thread-safe. */
#pragma once
#include <stdint.h>

#define FUT_SLOTS 4096

typedef enum { FUT_UNKNOWN = 0, FUT_PENDING, FUT_DONE } fut_state;

/* op_submit committed a new operation: pending for its tenant. An entry already done for
 * the same request_id (its loom_op_done arrived before the submit's worker got here) stays. */
void fut_cache_submitted(const char *request_id, int64_t tenant_id);

/* The LISTEN thread's callback for loom_op_done, before the loops are woken: a note with
 * the result marks its operation done; one without (a failure, a large result, another
 * sender's) forgets it; NULL (a reconnect: notifications may have been missed) forgets
 * everything. */
void fut_cache_noted(const char *payload, void *arg);

/* FUT_PENDING or FUT_DONE (*note: a malloc'd copy of the loom_op_done payload) for an entry
 * of this request_id and tenant; FUT_UNKNOWN otherwise (another tenant's request_id too:
 * the row's lookup answers that). */
fut_state fut_cache_get(const char *request_id, int64_t tenant_id, char **note);
