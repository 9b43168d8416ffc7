/* place.c: placement (docs/architecture.md, "Pools and placement"): a model waiting for an
 * executor goes to the live, not draining executor of its base model with the largest
 * share of its adapter memory left, and stays there (affinity). */
#include "scheduler/sched.h"
#include "scheduler/sched_sql.h"
#include "common/db.h"
#include "common/log.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t id;
    char base[256];
    double free;   /* bytes of adapter memory left, by the ranks placed there */
    double per_rank, budget;
} place_exe;

int sched_place(PGconn *c, int silence_s, char *err, size_t errlen) {
    /* Runs before every cycle build and almost always finds nothing: looked at first
     * outside a transaction (one round trip), then again under the transaction's locks. */
    PGresult *rm = db_query(c, SQL_PLACE_MODELS, 0, NULL, err, errlen);
    if (!rm) return -1;
    int waiting = PQntuples(rm);
    PQclear(rm);
    if (waiting == 0) return 0;
    if (db_begin(c, err, errlen) < 0) return -1;
    rm = db_query(c, SQL_PLACE_MODELS, 0, NULL, err, errlen);
    if (!rm) goto fail;
    if (PQntuples(rm) == 0) { PQclear(rm); db_rollback(c); return 0; }
    char secs[16];
    snprintf(secs, sizeof secs, "%d", silence_s);
    const char *ps[1] = {secs};
    PGresult *re = db_query(c, SQL_PLACE_EXECUTORS, 1, ps, err, errlen);
    if (!re) { PQclear(rm); goto fail; }
    int ne = PQntuples(re), placed = 0;
    place_exe *ex = calloc(ne ? ne : 1, sizeof *ex);
    for (int i = 0; i < ne; i++) {
        ex[i].id = db_int(re, i, 0);
        snprintf(ex[i].base, sizeof ex[i].base, "%s", PQgetvalue(re, i, 1));
        ex[i].free = strtod(PQgetvalue(re, i, 2), NULL);
        ex[i].per_rank = strtod(PQgetvalue(re, i, 3), NULL);
        ex[i].budget = strtod(PQgetvalue(re, i, 4), NULL);
    }
    PQclear(re);
    /* Each model, oldest request first, to the executor of its base model with the largest
     * share of its budget left (executors of different sizes fill in proportion; equal
     * ones take turns, whatever a few bytes of difference in their budgets); what it will
     * take is counted at once, so a burst of new models spreads. */
    for (int k = 0; k < PQntuples(rm); k++) {
        const char *base = PQgetvalue(rm, k, 1);
        place_exe *best = NULL;
        for (int i = 0; i < ne; i++) {
            if (strcmp(ex[i].base, base)) continue;
            double share = ex[i].free / ex[i].budget, best_share = best ? best->free / best->budget : 0;
            if (!best || share > best_share + 1e-9 || (share > best_share - 1e-9 && ex[i].free > best->free)) best = &ex[i];
        }
        if (!best) continue;   /* no live executor serves it: it waits (paused_capacity) */
        char eid[24];
        snprintf(eid, sizeof eid, "%lld", (long long)best->id);
        const char *pp[2] = {PQgetvalue(rm, k, 0), eid};
        if (db_exec(c, SQL_PLACE, 2, pp, err, errlen) < 0) { free(ex); PQclear(rm); goto fail; }
        best->free -= (double)db_int(rm, k, 2) * best->per_rank;
        placed++;
        log_debug("placed model %s on executor %s", PQgetvalue(rm, k, 0), eid);
    }
    free(ex);
    PQclear(rm);
    if (db_commit(c, err, errlen) < 0) return -1;
    return placed;
fail:
    db_rollback(c);
    return -1;
}
