/* api_usage.c: GET /api/v1/usage (docs/operating.md "Quotas and usage"): the calling key's tenant's
 * tokens per kind (train, prefill, sample) and per run over the last ?days= days (UTC,
 * default 30, at most 366), its checkpoint storage, its live work and its limits. Folded
 * usage is at most a few seconds behind (the scheduler folds every 2 s).
 * And GET /api/v1/billing/usage/checkpoints/current (SDK ≈0.34): the tenant's checkpoint
 * storage now, per project, priced at --storage-usd-per-gb-month. */
#include "common/db.h"
#include "core/api_call.h"
#include "tinker/api_sql.h"
#include "tinker/tinker.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#define GIGABYTE 1e9   /* the billing unit: decimal gigabytes */

/* CurrentCheckpointStorageUsageResponse: {"effective_rate_usd_per_gigabyte_month", "data":
 * [{project_id, org_user_urn, user_email, user_name, checkpoint_count, size_bytes,
 * size_gigabytes, estimated_monthly_cost_usd}]}: the caller's live checkpoints (what the
 * registry holds now: no lag), one row per project of the sessions that made them. Loom
 * has tenants, not users: the owner is the tenant (its name as user_name and as
 * org_user_urn, which search_checkpoints takes in owner_urns), with no email. */
int api_h_checkpoint_storage_current(api_call *c) {
    char tid[24], project[512];
    bool by_project = api_query_param(c, "project_id", project, sizeof project);
    if (by_project && (!project[0] || strlen(project) > 256))
        return api_error(c, 400, "project_id must be 1 to 256 bytes");
    api_fmt_i64(tid, c->tenant_id);
    const char *p[2] = {tid, by_project ? project : NULL};
    PGresult *r = db_query(c->db, SQL_CHECKPOINT_STORAGE_CURRENT, 2, p, c->err, sizeof c->err);
    if (!r) return api_db_error(c, "checkpoint storage usage", c->err);
    double rate = c->settings->storage_usd_per_gb_month;
    json_t *data = json_array();
    for (int i = 0; i < PQntuples(r); i++) {
        int64_t bytes = db_int(r, i, 3);
        double gb = (double)bytes / GIGABYTE;
        json_array_append_new(data, json_pack("{s:o, s:s, s:n, s:s, s:I, s:I, s:f, s:f}", "project_id",
                                              PQgetisnull(r, i, 0) ? json_null() : json_string(PQgetvalue(r, i, 0)),
                                              "org_user_urn", PQgetvalue(r, i, 1), "user_email", "user_name",
                                              PQgetvalue(r, i, 1), "checkpoint_count", (json_int_t)db_int(r, i, 2),
                                              "size_bytes", (json_int_t)bytes, "size_gigabytes", gb,
                                              "estimated_monthly_cost_usd", gb * rate));
    }
    PQclear(r);
    return api_reply_json(c, 200, json_pack("{s:f, s:o}", "effective_rate_usd_per_gigabyte_month", rate, "data", data));
}
