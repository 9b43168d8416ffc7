/* cycle.c: building the clock cycles of a scheduler's pass (docs/architecture.md, "Clock
 * cycles"): the candidates of every idle executor read under their locks, the planner's
 * decisions (planner.c, plan_pass) written, all in one transaction of four round trips
 * (db_pipeline) whatever the number of executors: lock the idle executors and read the
 * rate limits; lock their ready models and the queued samples; lock those models'
 * operations; claim, advance, notify and commit. An executor's own pass (it knows its id
 * and base model) sends its two reads with the first: two round trips. */
#include "scheduler/planner.h"
#include "scheduler/sched.h"
#include "scheduler/sched_sql.h"
#include "common/clock.h"
#include "common/common_sql.h"
#include "common/db.h"
#include "common/log.h"
#include "common/pgarray.h"
#include "common/xalloc.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Row r of SQL_LOCK_QUEUED_OPS or SQL_LOCK_READY_OPS_OWN (the same first columns but the
 * second: the model's index or id). */
static void op_row(plan_op *p, const PGresult *ro, int r) {
    *p = (plan_op){.id = db_int(ro, r, 0), .seq = (int)db_int(ro, r, 2), .tokens = (int)db_int(ro, r, 4),
                   .age_ms = strtod(PQgetvalue(ro, r, 5), NULL), .created_ms = strtod(PQgetvalue(ro, r, 6), NULL)};
    snprintf(p->kind, sizeof p->kind, "%s", PQgetvalue(ro, r, 3));
}

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
        op_row(&all[r], ro, r);
    }
    return all;
}

/* The rows of SQL_LOCK_READY_OPS_OWN as the models (*ms, *nm; their ids stay in ro) and
 * their operations (returned; one allocation each): a model's rows come together, in seq
 * order, the models in the order the pass serves them. */
static plan_op *read_own(const PGresult *ro, plan_model **ms, int *nm) {
    int no = PQntuples(ro), n = 0;
    plan_op *all = xcalloc((size_t)(no ? no : 1), sizeof *all);
    *ms = xcalloc((size_t)(no ? no : 1), sizeof **ms);
    for (int r = 0; r < no; r++) {
        const char *id = PQgetvalue(ro, r, 1);
        if (n == 0 || strcmp((*ms)[n - 1].id, id) != 0)
            (*ms)[n++] = (plan_model){.id = id, .next_seq = (int)db_int(ro, r, 7), .tenant = db_int(ro, r, 8),
                                      .pair_p = strtod(PQgetvalue(ro, r, 9), NULL),
                                      .pair_gap_ms = strtod(PQgetvalue(ro, r, 10), NULL),
                                      .tail_fb_ms = strtod(PQgetvalue(ro, r, 11), NULL), .ops = &all[r]};
        (*ms)[n - 1].nops++;
        op_row(&all[r], ro, r);
    }
    *nm = n;
    return all;
}

/* The last round trip: the cycles and their claims, the models advanced past what they
 * contribute with the pattern learned (rule 5), the executors busy, the notifications and
 * the commit. The executors' cycle ids go to their .cycle_id. 0, or -1 with err (the
 * caller rolls back). */
static int write_cycles(PGconn *c, const sched_opts *o, const db_stmt *pre, int npre, plan_executor *xs, int nx,
                        const plan_model *ms, int nm, int64_t *cycle_ids, char *err, size_t errlen) {
    char slease[16];
    snprintf(slease, sizeof slease, "%d", o->lease_s);
    pgarray exes, nops, ntok, ops, op_exes, ids, seqs, pair_p, gap, tail;
    pgarray *all[] = {&exes, &nops, &ntok, &ops, &op_exes, &ids, &seqs, &pair_p, &gap, &tail};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pga_init(all[i]);
    for (int e = 0; e < nx; e++) {
        const plan *p = &xs[e].cycle;
        if (p->nops == 0) continue;
        pga_int(&exes, xs[e].id);
        pga_int(&nops, p->nops);
        pga_int(&ntok, p->tokens);
        for (int i = 0; i < p->nops; i++) {
            pga_int(&ops, p->ops[i]);
            pga_int(&op_exes, xs[e].id);
        }
    }
    for (int i = 0; i < nm; i++) {
        if (!ms[i].taken) continue;
        pga_text(&ids, ms[i].id);
        pga_int(&seqs, ms[i].next_seq + ms[i].taken);
        pga_fixed(&pair_p, ms[i].pair_p, 4);
        pga_fixed(&gap, ms[i].pair_gap_ms, 3);
        pga_fixed(&tail, ms[i].tail_fb_ms, 3);
    }
    char *l[10];
    for (size_t i = 0; i < 10; i++) l[i] = pga_end(all[i]);
    const char *pc[12] = {l[0], l[1], l[2], slease, l[3], l[4], o->start ? "false" : "true",
                          l[5], l[6], l[7], l[8], l[9]};
    /* pre: what goes first (a hinted pass: its BEGIN, o->first and guard); an executor's
     * own cycle is started in the same transaction (sched_opts.start) */
    enum { MAX_PRE = 2 + SCHED_MAX_FIRST };
    db_stmt b[MAX_PRE + 4];
    db_bin bin[MAX_PRE + 4] = {{NULL, NULL, 0}};
    int nb = 0, start_at = -1;
    for (int i = 0; i < npre && i < MAX_PRE; i++) b[nb++] = pre[i];
    b[nb++] = (db_stmt){SQL_CLAIM_GENERIC, 0, NULL};
    int claim_at = nb;
    b[nb++] = (db_stmt){SQL_INSERT_CYCLES_CLAIM, 12, pc};
    if (o->start) {
        start_at = nb;
        if (o->start_bin) bin[nb] = *o->start_bin;
        b[nb++] = *o->start;
    }
    b[nb++] = (db_stmt){SQL_COMMIT, 0, NULL};
    PGresult *r[MAX_PRE + 4];
    int got = db_pipeline_bin(c, b, bin, nb, r, err, errlen);
    for (size_t i = 0; i < 10; i++) free(l[i]);
    for (int k = 0; got == nb && k < PQntuples(r[claim_at]); k++)
        for (int e = 0; e < nx; e++)
            if (xs[e].id == db_int(r[claim_at], k, 1)) cycle_ids[e] = db_int(r[claim_at], k, 0);
    if (start_at >= 0 && got == nb && o->started) {
        *o->started = r[start_at];
        r[start_at] = NULL;
    }
    for (int i = 0; i < nb; i++) PQclear(r[i]);
    return got == nb ? 0 : -1;
}

int sched_build_cycles(PGconn *c, int64_t only, const sched_opts *o, int64_t *cycle_id, int *held, char *err,
                       size_t errlen) {
    char lim[16], sonly[24];
    snprintf(sonly, sizeof sonly, "%lld", (long long)only);
    if (cycle_id) *cycle_id = 0;
    int claimed = -1, nx = 0, nm = 0, nsamp = 0;
    PGresult *rx = NULL, *rm = NULL, *rs = NULL;
    plan_rate *rates = NULL;
    plan_executor *xs = NULL;
    plan_model *ms = NULL;
    plan_sample *ss = NULL;
    plan_op *ops = NULL;
    int64_t *cycle_ids = NULL;

    if (o->started) *o->started = NULL;
    const char *p1[1] = {sonly};
    /* An executor's own pass reads its samples, models and their operations in this first
     * round trip too (SQL_LOCK_READY_OPS_OWN): two round trips in all instead of four. */
    bool own = only && o->only_base && o->only_base[0];
    char *own_base = NULL, own_lim[16];
    if (own) {
        pgarray ab;
        pga_init(&ab);
        pga_text(&ab, o->only_base);
        own_base = pga_end(&ab);
        snprintf(own_lim, sizeof own_lim, "%d", o->max_models);
    }
    char own_exe[32];
    snprintf(own_exe, sizeof own_exe, "{%lld}", (long long)only);
    const char *pown[3] = {own_exe, own_base, own_lim};
    db_stmt b1[6 + SCHED_MAX_FIRST];
    int n1 = 0;
    b1[n1++] = (db_stmt){SQL_BEGIN, 0, NULL};
    for (int i = 0; i < o->nfirst && i < SCHED_MAX_FIRST; i++) b1[n1++] = (db_stmt){o->first[i], 0, NULL};
    int at_x = n1;
    b1[n1++] = only ? (db_stmt){SQL_LOCK_IDLE_EXECUTOR, 1, p1} : (db_stmt){SQL_LOCK_IDLE_EXECUTORS, 0, NULL};
    b1[n1++] = (db_stmt){own ? SQL_TENANT_RATE_KEEP_HELD : SQL_TENANT_RATE, 0, NULL};
    if (own) {
        b1[n1++] = (db_stmt){SQL_LOCK_QUEUED_SAMPLES_OWN, 3, pown};
        b1[n1++] = (db_stmt){SQL_LOCK_READY_OPS_OWN, 3, pown};
    }
    PGresult *r1[6 + SCHED_MAX_FIRST];
    int got1 = db_pipeline(c, b1, n1, r1, err, errlen);
    free(own_base);
    for (int i = 0; i < at_x; i++) PQclear(r1[i]);
    rx = r1[at_x];
    PGresult *rr = r1[at_x + 1];
    if (own) {
        rs = r1[at_x + 2];
        rm = r1[at_x + 3];   /* the models' operations, with the models' columns */
    }
    if (got1 < n1 || PQntuples(rx) == 0) {
        claimed = got1 < n1 ? -1 : 0;
        PQclear(rr);
        goto done;
    }
    /* the executors' base models stay in rx until the cycles are written */
    nx = PQntuples(rx);
    xs = xcalloc((size_t)nx, sizeof *xs);
    cycle_ids = xcalloc((size_t)nx, sizeof *cycle_ids);
    pgarray ax, ab;
    pga_init(&ax);
    pga_init(&ab);
    for (int e = 0; e < nx; e++) {
        xs[e] = (plan_executor){.id = db_int(rx, e, 0), .base_model = PQgetvalue(rx, e, 1),
                                .budget = (int)db_int(rx, e, 2), .last_compute_ms = atof(PQgetvalue(rx, e, 3))};
        pga_int(&ax, xs[e].id);
        pga_text(&ab, xs[e].base_model);
    }
    char *l_exes = pga_end(&ax), *l_bases = pga_end(&ab);
    snprintf(lim, sizeof lim, "%d", o->max_models * nx);

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

    if (!own) {
        const char *p2[4] = {l_exes, l_bases, lim, held_tenants};
        db_stmt b2[2] = {{SQL_LOCK_READY_MODELS, 4, p2}, {SQL_LOCK_QUEUED_SAMPLES, 4, p2}};
        PGresult *r2[2];
        int got2 = db_pipeline(c, b2, 2, r2, err, errlen);
        rm = r2[0];
        rs = r2[1];
        if (got2 < 2) {
            free(held_tenants);
            free(l_exes);
            free(l_bases);
            goto done;
        }
    }
    free(held_tenants);
    free(l_exes);
    free(l_bases);
    /* the models' ids stay in rm, the samples' base models in rs, until the cycles are
     * written; each executor's models are a slice of ms (sorted by executor, in the order
     * read within one: the least recently served first) */
    if (own) {   /* one executor, the one SQL_LOCK_IDLE_EXECUTOR locked */
        ops = read_own(rm, &ms, &nm);
        xs[0].models = ms;
        xs[0].nmodels = nm;
    }
    nsamp = PQntuples(rs);
    if (!own) nm = PQntuples(rm);
    if (nm == 0 && nsamp == 0) {
        claimed = 0;
        goto done;
    }
    if (!own) ms = xcalloc((size_t)nm, sizeof *ms);
    int k = 0;
    for (int e = 0; e < nx && !own; e++) {
        xs[e].models = &ms[k];
        for (int i = 0; i < nm; i++) {
            if (db_int(rm, i, 6) != xs[e].id) continue;
            ms[k++] = (plan_model){.id = PQgetvalue(rm, i, 0), .next_seq = (int)db_int(rm, i, 1),
                                   .tenant = db_int(rm, i, 2), .pair_p = strtod(PQgetvalue(rm, i, 3), NULL),
                                   .pair_gap_ms = strtod(PQgetvalue(rm, i, 4), NULL),
                                   .tail_fb_ms = strtod(PQgetvalue(rm, i, 5), NULL)};
            xs[e].nmodels++;
        }
    }
    if (!own) nm = k;
    ss = xcalloc((size_t)nsamp, sizeof *ss);
    for (int i = 0; i < nsamp; i++)
        ss[i] = (plan_sample){.id = db_int(rs, i, 0), .tokens = (int)db_int(rs, i, 1), .tenant = db_int(rs, i, 2),
                              .base_model = PQgetvalue(rs, i, 3), .executor = db_int(rs, i, 4)};

    if (!own && nm > 0) {
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

    int held_ms = 0, nops = plan_pass(xs, nx, ss, nsamp, rates, nrate, o->pair_hold_ms, &held_ms);
    /* rule 5: look again when the first hold ends */
    if (held && held_ms > 0 && (*held <= 0 || held_ms < *held)) *held = held_ms;
    if (nops == 0) { claimed = 0; goto done; }
    if (write_cycles(c, o, NULL, 0, xs, nx, ms, nm, cycle_ids, err, errlen) < 0) goto done;
    claimed = nops;
    for (int e = 0; e < nx; e++) {
        if (!xs[e].cycle.nops) continue;
        if (cycle_id && xs[e].id == only) *cycle_id = cycle_ids[e];
        log_debug("cycle %lld: %d ops, %d tokens for executor %lld", (long long)cycle_ids[e], xs[e].cycle.nops,
                  xs[e].cycle.tokens, (long long)xs[e].id);
    }

done:
    if (claimed <= 0) db_rollback(c);
    for (int e = 0; e < nx; e++) plan_free(&xs[e].cycle);
    free(ops);
    free(ss);
    free(ms);
    free(xs);
    free(cycle_ids);
    free(rates);
    PQclear(rx);
    PQclear(rm);
    PQclear(rs);
    return claimed;
}

int sched_build_cycle(PGconn *c, int64_t executor_id, const sched_opts *o, int64_t *cycle_id, int *held, char *err,
                      size_t errlen) {
    return sched_build_cycles(c, executor_id, o, cycle_id, held, err, errlen);
}

bool sched_hint_parse(const char *payload, sched_hint *h) {
    long long op, tenant;
    int limited = 0, n = -1;
    double gap;
    *h = (sched_hint){0};
    size_t nq = strlen(CYCLE_HINT_QUEUED), np = strlen(CYCLE_HINT_PAIR);
    if (!strncmp(payload, CYCLE_HINT_QUEUED " ", nq + 1)) {
        payload += nq + 1;
    } else if (!strncmp(payload, CYCLE_HINT_PAIR " ", np + 1)) {
        if (sscanf(payload + np + 1, "%lf %n", &gap, &n) != 1 || n < 0) return false;
        h->pair = true;
        payload += np + 1 + n;
        n = -1;
    } else {
        return false;
    }
    if (sscanf(payload, "%lld %d %d %d %lf %lld %d %lf %lf %lf %31s %n", &op, &h->seq, &h->next_seq, &h->tokens,
               &h->created_ms, &tenant, &limited, &h->pair_p, &h->pair_gap_ms, &h->tail_fb_ms, h->kind, &n) != 11 ||
        n < 0)
        return false;
    const char *model = payload + n;
    size_t len = strlen(model);
    if (len == 0 || len >= sizeof h->model || strchr(model, ' ')) return false;
    memcpy(h->model, model, len + 1);
    h->op = op, h->tenant = tenant, h->limited = limited != 0;
    return true;
}

int sched_build_own_hinted(PGconn *c, int64_t executor, const char *base_model, int budget, const sched_opts *o,
                           const sched_hint *h, int n, int *held, char *err, size_t errlen) {
    enum { MAX_HINTS = 8 };
    if (o->started) *o->started = NULL;
    /* A gap at the first submit (an earlier seq_id not run yet), a rate limit, or not one
     * model's consecutive operations: the full pass reads what decides it. */
    if (n < 1 || n > MAX_HINTS || h[0].seq != h[0].next_seq) return -2;
    for (int i = 0; i < n; i++)
        if (h[i].limited || strcmp(h[i].model, h[0].model) || h[i].seq != h[0].seq + i) return -2;
    plan_op ops[MAX_HINTS];
    pgarray ids;
    pga_init(&ids);
    double now_ms = clock_wall_s() * 1000;
    for (int i = 0; i < n; i++) {
        double age = now_ms - h[i].created_ms;
        ops[i] = (plan_op){.id = h[i].op, .seq = h[i].seq, .tokens = h[i].tokens, .age_ms = age > 0 ? age : 0,
                           .created_ms = h[i].created_ms};
        snprintf(ops[i].kind, sizeof ops[i].kind, "%s", h[i].kind);
        pga_int(&ids, h[i].op);
    }
    char *sids = pga_end(&ids);
    /* what was learned of the model (rule 5) as the newest submit read it */
    const sched_hint *last = &h[n - 1];
    plan_model m = {.id = h[0].model, .tenant = h[0].tenant, .next_seq = h[0].seq, .ops = ops, .nops = n,
                    .pair_p = last->pair_p, .pair_gap_ms = last->pair_gap_ms, .tail_fb_ms = last->tail_fb_ms};
    /* one model: rule 5's round wait (other models' work waiting with a held one, bounded
     * by the executor's last cycle, executors.last_compute_ms) has nothing to hold here */
    plan_executor x = {.id = executor, .base_model = base_model, .budget = budget, .models = &m, .nmodels = 1};
    int held_ms = 0, nops = plan_pass(&x, 1, NULL, 0, NULL, 0, o->pair_hold_ms, &held_ms);
    if (held && held_ms > 0 && (*held <= 0 || held_ms < *held)) *held = held_ms;
    if (nops == 0) {
        plan_free(&x.cycle);
        free(sids);
        return 0;
    }
    char sexe[24], sbudget[16], sseq[16];
    snprintf(sexe, sizeof sexe, "%lld", (long long)executor);
    snprintf(sbudget, sizeof sbudget, "%d", budget);
    snprintf(sseq, sizeof sseq, "%d", h[0].seq);
    const char *pg[6] = {sexe, base_model, sbudget, h[0].model, sseq, sids};
    db_stmt pre[2 + SCHED_MAX_FIRST];
    int npre = 0;
    pre[npre++] = (db_stmt){SQL_BEGIN, 0, NULL};
    for (int i = 0; i < o->nfirst && i < SCHED_MAX_FIRST; i++) pre[npre++] = (db_stmt){o->first[i], 0, NULL};
    pre[npre++] = (db_stmt){SQL_OWN_HINT_GUARD, 6, pg};
    int64_t cycle_id = 0;
    int rc = write_cycles(c, o, pre, npre, &x, 1, &m, 1, &cycle_id, err, errlen);
    plan_free(&x.cycle);
    free(sids);
    if (rc == 0) return nops;
    bool refused = !strcmp(db_last_sqlstate(), SCHED_SQLSTATE_REFUSED);
    if (PQstatus(c) == CONNECTION_OK) db_rollback(c);
    return refused ? -2 : -1;
}
