/* api_usage.c: GET /api/v1/usage (README "Quotas and usage"): the calling key's tenant's
 * tokens per kind (train, prefill, sample) and per run over the last ?days= days (UTC,
 * default 30, at most 366), its checkpoint storage, its live work and its limits. Folded
 * usage is at most a few seconds behind (the scheduler folds every 2 s). */
#include "common/db.h"
#include "service/api_call.h"
#include "service/api_sql.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

int api_h_usage(api_call *c) {
    char days[24] = "30", tid[24];
    if (api_query_param(c, "days", days, sizeof days)) {
        char *end;
        long d = strtol(days, &end, 10);
        if (!days[0] || *end || d < 1 || d > 366)
            return api_error(c, 400, "days must be a whole number of days from 1 to 366, got '%s'", days);
    }
    api_fmt_i64(tid, c->tenant_id);
    const char *p[2] = {tid, days};
    PGresult *r = db_query(c->db, SQL_USAGE, 2, p, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "usage", c->err);
    if (PQntuples(r) == 0) {
        PQclear(r);
        return api_error(c, 404, "tenant not found");
    }
    /* The statement builds the document (`loom usage --json` prints the same one), with
     * PostgreSQL's json spacing ({"a" : 1}); it holds only strings and integers, so it
     * goes out through jansson as compact as the other answers, nothing lost. */
    json_error_t je;
    json_t *doc = json_loads(PQgetvalue(r, 0, 0), 0, &je);
    PQclear(r);
    if (!doc) return api_error(c, 500, "internal error: the usage document is not JSON: %s", je.text);
    return api_reply_json(c, 200, doc);
}
