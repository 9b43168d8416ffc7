/* cycle.c: building one clock cycle for one executor (docs/architecture.md, "Clock
 * cycles"): the candidates read under their locks, the planner's decision (planner.c)
 * written. Four round trips in all (db_pipeline): lock the executor and read the rate
 * limits; lock the ready models and queued samples; lock their operations; claim,
 * advance, notify and commit. */
#include "scheduler/planner.h"
#include "scheduler/sched.h"
#include "scheduler/sched_sql.h"
#include "common/common_sql.h"
#include "common/db.h"
#include "common/log.h"
#include "common/pgarray.h"
#include "common/xalloc.h"
#include <stdio.h>
#include <stdlib.h>

/* The rows of SQL_LOCK_QUEUED_OPS as the models' operations (one allocation for all):
 * the rows come grouped by their model's index in ms, in seq order, so each model's
 * operations are one slice. */
static plan_op *read_ops(const PGresult *ro, plan_model *ms) {
    int no = PQntuples(ro);
    plan_op *all = xcalloc((size_t)no, sizeof *all);
    for (int r = 0; r < no; r++) {
        plan_model *m = &ms[db_int(ro, r, 1)];
        if (!m->ops) m->ops = &all[r];
        m->nops++;
        all[r] = (plan_op){.id = db_int(ro, r, 0), .seq = (int)db_int(ro, r, 2), .tokens = (int)db_int(ro, r, 4),
                           .age_ms = strtod(PQgetvalue(ro, r, 5), NULL),
                           .created_ms = strtod(PQgetvalue(ro, r, 6), NULL)};
        snprintf(all[r].kind, sizeof all[r].kind, "%s", PQgetvalue(ro, r, 3));
    }
    return all;
}

/* The last round trip: the cycle and its claim, the models advanced past what they
 * contribute with the pattern learned (rule 5), the executor busy, the notification and
 * the commit. 0, or -1 with err (the caller rolls back). */
static int write_cycle(PGconn *c, const char *exe, const sched_opts *o, const plan *p, const plan_model *ms, int nm,
                       int64_t *cycle_id, char *err, size_t errlen) {
    char sops[16], stok[16], slease[16];
    snprintf(sops, sizeof sops, "%d", p->nops);
    snprintf(stok, sizeof stok, "%d", p->tokens);
    snprintf(slease, sizeof slease, "%d", o->lease_s);
    pgarray ops, ids, seqs, pair_p, gap, tail;
    pga_init(&ops);
    for (int i = 0; i < p->nops; i++) pga_int(&ops, p->ops[i]);
    pga_init(&ids);
    pga_init(&seqs);
    pga_init(&pair_p);
    pga_init(&gap);
    pga_init(&tail);
    for (int i = 0; i < nm; i++) {
        if (!ms[i].taken) continue;
        pga_text(&ids, ms[i].id);
        pga_int(&seqs, ms[i].next_seq + ms[i].taken);
        pga_fixed(&pair_p, ms[i].pair_p, 4);
        pga_fixed(&gap, ms[i].pair_gap_ms, 3);
        pga_fixed(&tail, ms[i].tail_fb_ms, 3);
    }
    char *l_ops = pga_end(&ops), *l_ids = pga_end(&ids), *l_seqs = pga_end(&seqs), *l_p = pga_end(&pair_p),
         *l_gap = pga_end(&gap), *l_tail = pga_end(&tail);
    const char *p5[5] = {exe, sops, stok, slease, l_ops};
    const char *p6[5] = {l_ids, l_seqs, l_p, l_gap, l_tail};
    const char *p7[1] = {exe};
    db_stmt b[5] = {{SQL_INSERT_CYCLE_CLAIM, 5, p5}, {SQL_ADVANCE_MODELS, 5, p6}, {SQL_EXECUTOR_BUSY, 1, p7},
                    {SQL_NOTIFY_CYCLE, 1, p7}, {SQL_COMMIT, 0, NULL}};
    PGresult *r[5];
    int got = db_pipeline(c, b, 5, r, err, errlen);
    free(l_ops); free(l_ids); free(l_seqs); free(l_p); free(l_gap); free(l_tail);
    *cycle_id = got == 5 ? db_int(r[0], 0, 0) : 0;
    for (int i = 0; i < 5; i++) PQclear(r[i]);
    return got == 5 ? 0 : -1;
}

int sched_build_cycle(PGconn *c, int64_t executor_id, const sched_opts *o, int64_t *cycle_id,
                      int *held, char *err, size_t errlen) {
    char exe[24], lim[16];
    snprintf(exe, sizeof exe, "%lld", (long long)executor_id);
    snprintf(lim, sizeof lim, "%d", o->max_models);
    *cycle_id = 0;
    int claimed = -1;
    PGresult *rm = NULL, *rs = NULL;
    plan_rate *rates = NULL;
    plan_model *ms = NULL;
    plan_sample *ss = NULL;
    plan_op *ops = NULL;
    plan p = {0};

    const char *p1[1] = {exe};
    db_stmt b1[3] = {{SQL_BEGIN, 0, NULL}, {SQL_LOCK_IDLE_EXECUTOR, 1, p1}, {SQL_TENANT_RATE, 0, NULL}};
    PGresult *r1[3];
    int got1 = db_pipeline(c, b1, 3, r1, err, errlen);
    PQclear(r1[0]);
    PGresult *re = r1[1], *rr = r1[2];
    if (got1 < 3 || PQntuples(re) == 0) {
        claimed = got1 < 3 ? -1 : 0;
        PQclear(re);
        PQclear(rr);
        goto done;
    }
    char base[256];
    snprintf(base, sizeof base, "%s", PQgetvalue(re, 0, 0));
    int budget = (int)db_int(re, 0, 1);
    PQclear(re);

    /* Rule 3: tenants with no tokens left in this minute are held (their futures say
     * paused_rate_limit): not even their candidates are read. */
    int nrate = PQntuples(rr);
    rates = xcalloc((size_t)nrate, sizeof *rates);
    for (int i = 0; i < nrate; i++) rates[i] = (plan_rate){db_int(rr, i, 0), db_int(rr, i, 1)};
    PQclear(rr);
    int64_t *held_ids = xcalloc((size_t)nrate, sizeof *held_ids);
    int nheld = plan_held_tenants(rates, nrate, held_ids);
    pgarray a;
    pga_init(&a);
    for (int i = 0; i < nheld; i++) pga_int(&a, held_ids[i]);
    free(held_ids);
    char *held_tenants = pga_end(&a);

    const char *p2[4] = {base, exe, lim, held_tenants};
    db_stmt b2[2] = {{SQL_LOCK_READY_MODELS, 4, p2}, {SQL_LOCK_QUEUED_SAMPLES, 4, p2}};
    PGresult *r2[2];
    int got2 = db_pipeline(c, b2, 2, r2, err, errlen);
    free(held_tenants);
    rm = r2[0];
    rs = r2[1];
    if (got2 < 2) goto done;
    int nm = PQntuples(rm), nsamp = PQntuples(rs);
    if (nm == 0 && nsamp == 0) { claimed = 0; goto done; }
    /* the models' ids stay in rm until the cycle is written */
    ms = xcalloc((size_t)nm, sizeof *ms);
    for (int i = 0; i < nm; i++)
        ms[i] = (plan_model){.id = PQgetvalue(rm, i, 0), .next_seq = (int)db_int(rm, i, 1), .tenant = db_int(rm, i, 2),
                             .pair_p = strtod(PQgetvalue(rm, i, 3), NULL),
                             .pair_gap_ms = strtod(PQgetvalue(rm, i, 4), NULL),
                             .tail_fb_ms = strtod(PQgetvalue(rm, i, 5), NULL)};
    ss = xcalloc((size_t)nsamp, sizeof *ss);
    for (int k = 0; k < nsamp; k++)
        ss[k] = (plan_sample){.id = db_int(rs, k, 0), .tokens = (int)db_int(rs, k, 1), .tenant = db_int(rs, k, 2)};

    if (nm > 0) {
        pga_init(&a);
        for (int i = 0; i < nm; i++) pga_text(&a, ms[i].id);
        char *ids = pga_end(&a);
        const char *p3[1] = {ids};
        PGresult *ro = db_query(c, SQL_LOCK_QUEUED_OPS, 1, p3, err, errlen);
        free(ids);
        if (!ro) goto done;
        ops = read_ops(ro, ms);
        PQclear(ro);
    }

    plan_input in = {.budget = budget, .pair_hold_ms = o->pair_hold_ms, .rates = rates, .nrates = nrate,
                     .models = ms, .nmodels = nm, .samples = ss, .nsamples = nsamp};
    plan_cycle(&in, &p);
    /* rule 5: look again when the first hold ends (the caller gathers over executors) */
    if (held && p.held_ms > 0 && (*held <= 0 || p.held_ms < *held)) *held = p.held_ms;
    if (p.nops == 0) { claimed = 0; goto done; }
    if (write_cycle(c, exe, o, &p, ms, nm, cycle_id, err, errlen) < 0) goto done;
    claimed = p.nops;
    log_debug("cycle %lld: %d ops, %d tokens for executor %s", (long long)*cycle_id, p.nops, p.tokens, exe);

done:
    if (claimed <= 0) db_rollback(c);
    plan_free(&p);
    free(ops);
    free(ss);
    free(ms);
    free(rates);
    PQclear(rm);
    PQclear(rs);
    return claimed;
}
