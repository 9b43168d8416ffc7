/* cycle.c: building one clock cycle for one executor (docs/architecture.md, "Clock cycles").
 *
 * Per model, operations run in seq_id order starting at models.next_seq; a gap stops
 * the model (out-of-order arrivals wait). A model contributes a run: create_model (seq 0)
 * first if pending, then forward/forward_backward operations, then at most one
 * optim_step, after which the model's run ends (later work must see the new weights and
 * waits for the next cycle). A run that ends in a forward_backward is held back for its
 * optim_step when the model has shown that one follows (hold_left). The token
 * budget is shared between tenants round-robin: each round every tenant with work left
 * may add operations up to an equal share, so a tenant with a huge backlog cannot starve
 * a small one. A single operation larger than the budget still runs, alone. */
#include "scheduler/sched.h"
#include "scheduler/sched_sql.h"
#include "common/common_sql.h"
#include "common/db.h"
#include "common/log.h"
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t id;
    int seq;
    char kind[32];
    int tokens;
    double age_ms, created_ms;
} qop;

typedef struct {
    char id[256];
    int64_t tenant;
    int next_seq;      /* first seq not taken */
    qop *ops;          /* eligible consecutive run, in order */
    int nops, taken;
    bool closed;       /* optim_step taken: nothing more this cycle */
    bool is_sample;    /* a single sample op: no model, no seq order */
    /* its pattern (rule 5): P(the op after a forward_backward is an optim_step), the gap
     * between their submits (ms, -1 unknown), the submit time of its last claimed op when
     * that was a forward_backward (epoch ms, -1 none) */
    double pair_p, pair_gap_ms, tail_fb_ms;
} qmodel;

/* Rule 5, learned per model: a run ending in a forward_backward is held for the
 * optim_step only when the model's history says one follows (pair_p > 0.5), and only for
 * about the gap its client leaves between the two submits (3 gaps + 1 ms), never longer
 * than pair_hold_ms. A new model is not held (its first step may take two cycles); a
 * model that sends forward_backwards alone, or accumulates gradients over several, is
 * never held once it has shown it. Returns the hold left in ms (<= 0: none). */
static double hold_left(const qmodel *m, const qop *last, int pair_hold_ms) {
    if (pair_hold_ms <= 0 || strcmp(last->kind, OP_FORWARD_BACKWARD) || m->pair_p <= 0.5) return 0;
    double window = m->pair_gap_ms >= 0 ? 3 * m->pair_gap_ms + 1 : pair_hold_ms;
    if (window > pair_hold_ms) window = pair_hold_ms;
    return window - last->age_ms;
}

/* A tenant's rate limit in this cycle: tokens it may still claim. */
typedef struct {
    int64_t tenant;
    int64_t left;
    bool claimed;   /* it claimed something already in this cycle */
} rate_left;

#define PAIR_ALPHA 0.3   /* weight of the newest observation in the moving averages */

/* Learns from the ops of m claimed now (m->ops[0..taken)), after its previous claim. */
static void learn_pattern(qmodel *m) {
    for (int i = 0; i < m->taken; i++) {
        const qop *q = &m->ops[i];
        if (m->tail_fb_ms >= 0) {
            bool hit = !strcmp(q->kind, OP_OPTIM_STEP);
            m->pair_p = (1 - PAIR_ALPHA) * m->pair_p + PAIR_ALPHA * (hit ? 1 : 0);
            double gap = q->created_ms - m->tail_fb_ms;
            if (hit && gap >= 0) m->pair_gap_ms = m->pair_gap_ms < 0 ? gap : (1 - PAIR_ALPHA) * m->pair_gap_ms + PAIR_ALPHA * gap;
        }
        m->tail_fb_ms = !strcmp(q->kind, OP_FORWARD_BACKWARD) ? q->created_ms : -1;
    }
}

/* Length of the eligible run of a model's queued ops (sorted by seq). */
static int eligible_run(qmodel *m) {
    int n = 0, seq = m->next_seq;
    bool seen_step = false;
    for (int i = 0; i < m->nops && !seen_step; i++) {
        if (m->ops[i].seq != seq) break;           /* gap: wait for the missing op */
        const char *k = m->ops[i].kind;
        if (!strcmp(k, OP_CREATE_MODEL)) {
            if (i != 0) break;
        } else if (!strcmp(k, OP_OPTIM_STEP)) {
            seen_step = true;
        } else if (strcmp(k, OP_FORWARD) && strcmp(k, OP_FORWARD_BACKWARD)) {
            /* checkpoint / sampler work: runs after the step, alone at the end of the run */
            if (n > 0) { n++; break; }
            seen_step = true;
        }
        n++;
        seq++;
    }
    return n;
}

/* Writes a PostgreSQL array literal of ids into a growable buffer. Model ids are
 * server-made (uuid:train:N) and carry no quotes or commas, but quote them anyway. */
static char *array_literal_text(qmodel *ms, int n) {
    size_t cap = 16;
    for (int i = 0; i < n; i++) cap += strlen(ms[i].id) * 2 + 4;
    char *s = malloc(cap), *p = s;
    *p++ = '{';
    for (int i = 0; i < n; i++) {
        if (i) *p++ = ',';
        *p++ = '"';
        for (const char *c = ms[i].id; *c; c++) {
            if (*c == '"' || *c == '\\') *p++ = '\\';
            *p++ = *c;
        }
        *p++ = '"';
    }
    *p++ = '}';
    *p = 0;
    return s;
}

int sched_build_cycle(PGconn *c, int64_t executor_id, const sched_opts *o, int64_t *cycle_id,
                      int *held, char *err, size_t errlen) {
    char exe[24], lim[16];
    snprintf(exe, sizeof exe, "%lld", (long long)executor_id);
    snprintf(lim, sizeof lim, "%d", o->max_models);
    *cycle_id = 0;
    /* Four round trips in all (db_pipeline): lock the executor and read the rate limits;
     * lock the ready models and queued samples; lock their operations; claim, advance,
     * notify and commit. */
    const char *p1[1] = {exe};
    db_stmt b1[3] = {{SQL_BEGIN, 0, NULL}, {SQL_LOCK_IDLE_EXECUTOR, 1, p1}, {SQL_TENANT_RATE, 0, NULL}};
    PGresult *r1[3];
    if (db_pipeline(c, b1, 3, r1, err, errlen) < 3) {
        for (int i = 0; i < 3; i++) PQclear(r1[i]);
        goto fail;
    }
    PQclear(r1[0]);
    PGresult *re = r1[1], *rr = r1[2];
    if (PQntuples(re) == 0) { PQclear(re); PQclear(rr); db_rollback(c); return 0; }
    char base[256];
    snprintf(base, sizeof base, "%s", PQgetvalue(re, 0, 0));
    int budget = (int)db_int(re, 0, 1);
    PQclear(re);

    /* Rate limits: tenants with no tokens left in this minute are held (their futures say
     * paused_rate_limit); the others may claim at most what they have left. */
    int nrate = PQntuples(rr);
    rate_left *rates = calloc(nrate ? nrate : 1, sizeof *rates);
    char *held_tenants = malloc(16 + (size_t)nrate * 22), *hp = held_tenants;
    hp += sprintf(hp, "{");
    for (int i = 0; i < nrate; i++) {
        rates[i] = (rate_left){db_int(rr, i, 0), db_int(rr, i, 1), false};
        if (rates[i].left <= 0) hp += sprintf(hp, "%s%lld", hp[-1] == '{' ? "" : ",", (long long)rates[i].tenant);
    }
    sprintf(hp, "}");
    PQclear(rr);

    const char *p2[4] = {base, exe, lim, held_tenants};
    db_stmt b2[2] = {{SQL_LOCK_READY_MODELS, 4, p2}, {SQL_LOCK_QUEUED_SAMPLES, 4, p2}};
    PGresult *r2[2];
    int got2 = db_pipeline(c, b2, 2, r2, err, errlen);
    free(held_tenants);
    if (got2 < 2) { PQclear(r2[0]); PQclear(r2[1]); free(rates); goto fail; }
    PGresult *rm = r2[0], *rs = r2[1];
    int nm = PQntuples(rm), nsamp = PQntuples(rs);
    if (nm == 0 && nsamp == 0) { PQclear(rm); PQclear(rs); free(rates); db_rollback(c); return 0; }
    /* Runs: one per model, then one per sample op (samples have no order between them). */
    qmodel *ms = calloc(nm + nsamp, sizeof *ms);
    for (int i = 0; i < nm; i++) {
        snprintf(ms[i].id, sizeof ms[i].id, "%s", PQgetvalue(rm, i, 0));
        ms[i].next_seq = (int)db_int(rm, i, 1);
        ms[i].tenant = db_int(rm, i, 2);
        ms[i].pair_p = strtod(PQgetvalue(rm, i, 3), NULL);
        ms[i].pair_gap_ms = strtod(PQgetvalue(rm, i, 4), NULL);
        ms[i].tail_fb_ms = strtod(PQgetvalue(rm, i, 5), NULL);
    }
    PQclear(rm);

    PGresult *ro = NULL;
    int no = 0;
    if (nm > 0) {
        char *ids = array_literal_text(ms, nm);
        const char *p3[1] = {ids};
        ro = db_query(c, SQL_LOCK_QUEUED_OPS, 1, p3, err, errlen);
        free(ids);
        if (!ro) { free(ms); PQclear(rs); goto fail; }
        no = PQntuples(ro);
    }
    /* One pass: the rows come grouped by their model's index in ms, in seq order, so each
     * model's operations are one slice of all. */
    qop *all = calloc(no + nsamp + 1, sizeof *all);
    int j = 0;
    for (int r = 0; r < no; r++, j++) {
        qmodel *m = &ms[db_int(ro, r, 1)];
        if (!m->ops) m->ops = &all[j];
        m->nops++;
        all[j] = (qop){.id = db_int(ro, r, 0), .seq = (int)db_int(ro, r, 2), .tokens = (int)db_int(ro, r, 4),
                       .age_ms = strtod(PQgetvalue(ro, r, 5), NULL), .created_ms = strtod(PQgetvalue(ro, r, 6), NULL)};
        snprintf(all[j].kind, sizeof all[j].kind, "%s", PQgetvalue(ro, r, 3));
    }
    for (int i = 0; i < nm; i++) {
        ms[i].nops = eligible_run(&ms[i]);
        /* docs/architecture.md, rule 5: a run that ends in a fresh forward_backward of a model whose
         * optim_step usually follows at once is held briefly, so that both share a cycle. */
        if (ms[i].nops > 0) {
            double left = hold_left(&ms[i], &ms[i].ops[ms[i].nops - 1], o->pair_hold_ms);
            if (left > 0) {
                ms[i].nops = 0;
                if (held && (*held <= 0 || left < *held)) *held = (int)left + 1;
            }
        }
    }
    if (ro) PQclear(ro);
    for (int k = 0; k < nsamp; k++) {
        qmodel *m = &ms[nm + k];
        m->is_sample = true;
        m->tenant = db_int(rs, k, 2);
        m->ops = &all[j++];
        m->ops->id = db_int(rs, k, 0);
        m->ops->tokens = (int)db_int(rs, k, 1);
        snprintf(m->ops->kind, sizeof m->ops->kind, OP_SAMPLE);
        m->nops = 1;
    }
    PQclear(rs);
    no += nsamp;
    nm += nsamp;

    /* Round-robin over tenants by equal token shares. */
    int used = 0, nclaimed = 0;
    int64_t *claimed = calloc(no ? no : 1, sizeof *claimed);
    bool progress = true;
    while (progress && used < budget) {
        progress = false;
        int64_t tenants_seen[256];
        int nt = 0;
        for (int i = 0; i < nm; i++) {
            if (ms[i].taken >= ms[i].nops) continue;
            bool seen = false;
            for (int t = 0; t < nt; t++) seen |= tenants_seen[t] == ms[i].tenant;
            if (!seen && nt < 256) tenants_seen[nt++] = ms[i].tenant;
        }
        if (nt == 0) break;
        int share = (budget - used) / nt;
        if (share < 1) share = 1;
        for (int t = 0; t < nt && used < budget; t++) {
            int tused = 0;
            rate_left *rl = NULL;   /* the tenant's rate limit, if it has one */
            for (int k = 0; k < nrate; k++) if (rates[k].tenant == tenants_seen[t]) rl = &rates[k];
            for (int i = 0; i < nm; i++) {
                qmodel *m = &ms[i];
                if (m->tenant != tenants_seen[t]) continue;
                while (m->taken < m->nops) {
                    qop *q = &m->ops[m->taken];
                    bool first_of_cycle = nclaimed == 0;
                    if (!first_of_cycle && (tused + q->tokens > share || used + q->tokens > budget)) break;
                    /* past its rate limit only with its first operation (one larger than a
                     * minute's tokens still runs: it then waits out the minute) */
                    if (rl && q->tokens > rl->left && rl->claimed) break;
                    claimed[nclaimed++] = q->id;
                    tused += q->tokens;
                    used += q->tokens;
                    if (rl) { rl->left -= q->tokens; rl->claimed = true; }
                    m->taken++;
                    progress = true;
                }
            }
        }
    }
    for (int i = 0; i < nm; i++)
        if (ms[i].taken && !ms[i].is_sample) learn_pattern(&ms[i]);
    free(all);
    free(rates);
    if (nclaimed == 0) { free(ms); free(claimed); db_rollback(c); return 0; }

    char sops[16], stok[16], slease[16];
    snprintf(sops, sizeof sops, "%d", nclaimed);
    snprintf(stok, sizeof stok, "%d", used);
    snprintf(slease, sizeof slease, "%d", o->lease_s);

    /* {id,id,...} literals for the claim and the model advance. */
    size_t cap = 32 + (size_t)nclaimed * 22;
    char *oplist = malloc(cap), *w = oplist;
    w += sprintf(w, "{");
    for (int i = 0; i < nclaimed; i++) w += sprintf(w, "%s%lld", i ? "," : "", (long long)claimed[i]);
    sprintf(w, "}");
    free(claimed);
    int nadv = 0;
    for (int i = 0; i < nm; i++)
        if (ms[i].taken && !ms[i].is_sample) ms[nadv++] = ms[i];
    char *mids = array_literal_text(ms, nadv);
    char *seqs = malloc(16 + (size_t)nadv * 12), *s = seqs;
    s += sprintf(s, "{");
    for (int i = 0; i < nadv; i++) s += sprintf(s, "%s%d", i ? "," : "", ms[i].next_seq + ms[i].taken);
    sprintf(s, "}");
    char *pp = malloc(16 + (size_t)nadv * 96), *pg = pp + 8 + (size_t)nadv * 32, *pt = pg + 4 + (size_t)nadv * 32;
    char *a = pp, *b = pg, *t = pt;
    a += sprintf(a, "{");
    b += sprintf(b, "{");
    t += sprintf(t, "{");
    for (int i = 0; i < nadv; i++) {
        a += sprintf(a, "%s%.4f", i ? "," : "", ms[i].pair_p);
        b += sprintf(b, "%s%.3f", i ? "," : "", ms[i].pair_gap_ms);
        t += sprintf(t, "%s%.3f", i ? "," : "", ms[i].tail_fb_ms);
    }
    sprintf(a, "}");
    sprintf(b, "}");
    sprintf(t, "}");
    free(ms);

    const char *p5[5] = {exe, sops, stok, slease, oplist};
    const char *p6[5] = {mids, seqs, pp, pg, pt};
    const char *p7[1] = {exe};
    db_stmt b4[5] = {{SQL_INSERT_CYCLE_CLAIM, 5, p5}, {SQL_ADVANCE_MODELS, 5, p6}, {SQL_EXECUTOR_BUSY, 1, p7},
                     {SQL_NOTIFY_CYCLE, 1, p7}, {SQL_COMMIT, 0, NULL}};
    PGresult *r4[5];
    int got4 = db_pipeline(c, b4, 5, r4, err, errlen);
    free(oplist); free(mids); free(seqs); free(pp);
    char cyc[24] = "";
    if (got4 >= 1) {
        snprintf(cyc, sizeof cyc, "%s", PQgetvalue(r4[0], 0, 0));
        *cycle_id = db_int(r4[0], 0, 0);
    }
    for (int i = 0; i < 5; i++) PQclear(r4[i]);
    if (got4 < 5) { *cycle_id = 0; goto fail; }
    log_debug("cycle %s: %d ops, %d tokens for executor %s", cyc, nclaimed, used, exe);
    return nclaimed;
fail:
    db_rollback(c);
    return -1;
}

int sched_reap(PGconn *c, bool judge_silence, int silence_s, char *err, size_t errlen) {
    int changed = 0;
    if (db_begin(c, err, errlen) < 0) return -1;
    char secs[16];
    snprintf(secs, sizeof secs, "%d", silence_s);
    const char *pj[2] = {judge_silence ? "t" : "f", secs};
    PGresult *r;
    if (!(r = db_query(c, SQL_REAP_EXECUTORS, 2, pj, err, errlen))) goto fail;
    changed += atoi(PQcmdTuples(r));
    PQclear(r);
    if (!(r = db_query(c, SQL_REAP_CYCLES, 1, pj, err, errlen))) goto fail;
    int expired = PQntuples(r);
    PQclear(r);
    if (expired > 0) {
        if (db_exec(c, SQL_REAP_LEASE_LOST, 0, NULL, err, errlen) < 0) goto fail;
        log_warn("reaper: %d cycle(s) expired", expired);
        changed += expired;
    }
    if (!(r = db_query(c, SQL_REQUEUE_SAMPLES, 0, NULL, err, errlen))) goto fail;
    changed += PQntuples(r);
    PQclear(r);
    if (!(r = db_query(c, SQL_REQUEUE_MODEL_OPS, 0, NULL, err, errlen))) goto fail;
    if (PQntuples(r) > 0) log_warn("reaper: %d operation(s) of expired cycles queued again", PQntuples(r));
    changed += PQntuples(r);
    PQclear(r);
    if (!(r = db_query(c, SQL_FAIL_ORPHANED_SAMPLES, 0, NULL, err, errlen))) goto fail;
    changed += PQntuples(r);
    PQclear(r);
    if (!(r = db_query(c, SQL_UNPIN_GONE, 0, NULL, err, errlen))) goto fail;
    if (PQntuples(r) > 0) log_warn("reaper: %d model(s) of gone executors to be placed again", PQntuples(r));
    changed += PQntuples(r);
    PQclear(r);
    if (db_exec(c, SQL_DROP_INACTIVE_SNAPSHOTS, 0, NULL, err, errlen) < 0) goto fail;
    if (db_commit(c, err, errlen) < 0) return -1;
    return changed;
fail:
    db_rollback(c);
    return -1;
}

int sched_skip_settled(PGconn *c, char *err, size_t errlen) {
    PGresult *r = db_query(c, SQL_SKIP_SETTLED, 0, NULL, err, errlen);
    if (!r) return -1;
    int n = atoi(PQcmdTuples(r));
    PQclear(r);
    return n;
}

int sched_give_up_gaps(PGconn *c, int gap_timeout_s, char *err, size_t errlen) {
    char secs[16];
    snprintf(secs, sizeof secs, "%d", gap_timeout_s);
    const char *p[1] = {secs};
    PGresult *r = db_query(c, SQL_GIVE_UP_GAPS, 1, p, err, errlen);
    if (!r) return -1;
    int failed = PQntuples(r);
    if (failed) log_warn("gave up on missing seq_ids of %s model(s) after %d s: %d waiting operation(s) failed",
                         PQgetvalue(r, 0, 1), gap_timeout_s, failed);
    PQclear(r);
    if (!(r = db_query(c, SQL_FAIL_STRAGGLERS, 0, NULL, err, errlen))) return -1;
    int late = PQntuples(r);
    PQclear(r);
    return failed + late;
}

int sched_expire_sessions(PGconn *c, int timeout_s, char *err, size_t errlen) {
    char secs[16];
    snprintf(secs, sizeof secs, "%d", timeout_s);
    const char *p[1] = {secs};
    PGresult *r = db_query(c, SQL_EXPIRE_SESSIONS, 1, p, err, errlen);
    if (!r) return -1;
    int n = PQntuples(r);
    PQclear(r);
    if (!(r = db_query(c, SQL_EXPIRE_MODELS, 0, NULL, err, errlen))) return -1;
    int models = atoi(PQcmdTuples(r));
    PQclear(r);
    if (db_exec(c, SQL_DROP_EXPIRED_SAMPLER_SNAPSHOTS, 0, NULL, err, errlen) < 0) return -1;
    if (models) log_info("sessions: %d model(s) of expired sessions saved and expired", models);
    if (n) log_info("sessions: expired after %d s of silence; %d operation(s) canceled or queued", timeout_s, n);
    return n + models;
}

/* ---- placement ------------------------------------------------------------------------------- */

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
