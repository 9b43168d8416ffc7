/* api_usage.c: GET /api/v1/usage (README "Quotas and usage"): the calling key's tenant's
 * tokens per kind (train, prefill, sample) and per run over the last ?days= days (UTC,
 * default 30, at most 366), its checkpoint storage, its live work and its limits. Folded
 * usage is at most a few seconds behind (the scheduler folds every 2 s). */
#include "common/db.h"
#include "service/api_call.h"
#include "service/api_sql.h"
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
    return api_reply_sql_json(c, "usage", SQL_USAGE, 2, p, "tenant not found");
}
