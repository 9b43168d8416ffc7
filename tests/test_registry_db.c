/* test_registry_db.c: the registry against a real PostgreSQL cluster started for this
 * test: version rows with provenance (op range since the parent, hyper-parameters, loss
 * summary, data digest), name clashes and overwrite, lineage across load_weights, the
 * access rules between tenants (own / grant / public, read-only for non-owners), TTL,
 * the operator views, GC with keep-last, and GC racing concurrent saves that reuse the
 * same blobs: a live version's blob must never disappear. */
#include "common/db.h"
#include "common/migrate.h"
#include "common/pgcluster.h"
#include "registry/registry.h"
#include "registry/reg_sql.h"
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int passed, failed;
#define CHECK(cond, ...) do { if (cond) { passed++; printf("ok    "); } else { failed++; printf("FAIL  "); } \
    printf(__VA_ARGS__); printf("\n"); } while (0)

static char conninfo[1024];
static PGconn *C;
static blobstore *B;

static void sql(const char *q) {
    char err[512];
    if (db_exec(C, q, 0, NULL, err, sizeof err) < 0) { fprintf(stderr, "SQL failed: %s\n%s\n", q, err); exit(2); }
}

static char *text(const char *q) {
    static char buf[4096];
    char err[512];
    PGresult *r = db_query(C, q, 0, NULL, err, sizeof err);
    if (!r) { fprintf(stderr, "SQL failed: %s\n%s\n", q, err); exit(2); }
    snprintf(buf, sizeof buf, "%s", PQntuples(r) ? PQgetvalue(r, 0, 0) : "");
    PQclear(r);
    return buf;
}

static long scalar(const char *q) { return atol(text(q)); }

static int save(PGconn *c, const char *model, int seq, const char *kind, const char *name, const char *digest,
                bool overwrite, int64_t ttl, int64_t *vid, char *err, size_t errlen) {
    reg_new_version v = {.model_id = model, .seq_id = seq, .kind = kind, .name = name, .digest = digest,
                         .size_bytes = 100, .step = seq, .ttl_seconds = ttl, .overwrite = overwrite};
    if (db_begin(c, err, errlen) < 0) return -1;
    int rc = reg_blob_lock_shared(c, digest, err, errlen) < 0 ? -1 : reg_version_insert(c, &v, vid, err, errlen);
    if (rc != 0) { db_rollback(c); return rc; }
    return db_commit(c, err, errlen) < 0 ? -1 : 0;
}

static void put(const char *bytes, char digest[BLOB_DIGEST_HEX]) {
    char err[256];
    if (blob_put(B, bytes, strlen(bytes), digest, err, sizeof err) < 0) { fprintf(stderr, "%s\n", err); exit(2); }
}

static void setup(void) {
    sql("INSERT INTO tenants (name) VALUES ('a'), ('b'), ('c')");
    sql("INSERT INTO base_models (name, path, arch, max_context, vocab_size, config)"
        " VALUES ('m', '/x', 'LlamaForCausalLM', 128, 256, '{}')");
    sql("INSERT INTO sessions (id, tenant_id) VALUES ('sa', 1), ('sb', 2)");
    sql("INSERT INTO models (id, tenant_id, session_id, model_seq_id, base_model, lora_rank, lora_seed, train_attn,"
        " train_mlp, train_unembed) VALUES ('sa:train:0', 1, 'sa', 0, 'm', 8, 1, true, true, true),"
        " ('sa:train:1', 1, 'sa', 1, 'm', 8, 2, true, true, true), ('sb:train:0', 2, 'sb', 0, 'm', 8, 3, true, true, false)");
    sql("INSERT INTO api_keys (tenant_id, prefix, hash) VALUES (1, 'abcdefgh', '\\x01')");
    /* model sa:train:0: fb (seq 1), optim (2), then the save at seq 3; fb (4), failed fb (5), save at 6 */
    sql("INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload, n_tokens, state, result) VALUES"
        " ('r1', 1, 'sa:train:0', 1, 'forward_backward', '{\"data\": [{\"tokens\": [1, 2, 3], \"target_tokens\": [2, 3, 4]}],"
        "   \"loss_fn\": \"cross_entropy\"}', 3, 'done', '{\"metrics\": {\"loss:sum\": 3.5}}'),"
        " ('r2', 1, 'sa:train:0', 2, 'optim_step', '{\"adam_params\": {\"learning_rate\": 0.01}}', 0, 'done', '{}'),"
        " ('r4', 1, 'sa:train:0', 4, 'forward_backward', '{\"data\": [{\"tokens\": [5], \"target_tokens\": [6]}],"
        "   \"loss_fn\": \"importance_sampling\"}', 1, 'done', '{\"metrics\": {\"loss:sum\": 1.25}}'),"
        " ('r5', 1, 'sa:train:0', 5, 'forward_backward', '{\"data\": [{\"tokens\": [9], \"target_tokens\": [9]}]}', 1,"
        "   'failed', NULL)");
}

static void test_versions(void) {
    char err[512], d1[BLOB_DIGEST_HEX], d2[BLOB_DIGEST_HEX];
    int64_t v1, v2, v3;
    put("blob one", d1);
    put("blob two", d2);
    reg_new_version nv = {.model_id = "sa:train:0", .seq_id = 3, .kind = "training", .name = "000003", .digest = d1,
                          .size_bytes = 8, .step = 1, .ttl_seconds = -1, .key_id = 1};
    db_begin(C, err, sizeof err);
    int rc = reg_version_insert(C, &nv, &v1, err, sizeof err);
    db_commit(C, err, sizeof err);
    CHECK(rc == 0, "first version saved: %s", rc ? err : "");
    char q[1024];
    snprintf(q, sizeof q, "SELECT provenance::text FROM adapter_versions WHERE id = %lld", (long long)v1);
    printf("      provenance: %s\n", text(q));
    snprintf(q, sizeof q, "SELECT (provenance->>'seq_from')::int = 1 AND (provenance->>'seq_to')::int = 2"
             " AND (provenance->>'forward_backward_ops')::int = 1 AND (provenance->>'tokens')::int = 3"
             " AND (provenance->'loss'->>'sum')::float8 = 3.5 AND provenance->'hyperparameters' = '[{\"learning_rate\": 0.01}]'"
             " AND provenance->>'created_by_key' = 'tml-abcdefgh...' AND parent_id IS NULL AND seq_id = 3"
             " AND tinker_path = 'tinker://sa:train:0/weights/000003' AND kind = 'training' AND expires_at IS NULL"
             " FROM adapter_versions WHERE id = %lld", (long long)v1);
    CHECK(!strcmp(text(q), "t"), "provenance: op range 1..2, one fwd/bwd, 3 tokens, loss 3.5, lr 0.01, creator key");
    snprintf(q, sizeof q, "SELECT provenance->>'data_digest' = encode(sha256(convert_to((SELECT (payload->'data')::text"
             " FROM operations WHERE request_id = 'r1'), 'UTF8')), 'hex') FROM adapter_versions WHERE id = %lld",
             (long long)v1);
    CHECK(!strcmp(text(q), "t"), "data digest = sha256 of the consumed data");
    CHECK(scalar("SELECT count(*) FROM adapters WHERE name = 'sa:train:0' AND tenant_id = 1") == 1,
          "adapter row named after the model");

    rc = save(C, "sa:train:0", 3, "training", "000003", d1, false, -1, &v2, err, sizeof err);
    CHECK(rc == 1 && strstr(err, "already exists"), "same name, overwrite false: refused (%s)", err);
    CHECK(scalar("SELECT count(*) FROM adapter_versions") == 1, "... and nothing written");
    rc = save(C, "sa:train:0", 6, "training", "000003", d2, true, -1, &v2, err, sizeof err);
    snprintf(q, sizeof q, "SELECT (SELECT deleted_at IS NOT NULL FROM adapter_versions WHERE id = %lld)"
             " AND (SELECT parent_id = %lld AND (provenance->>'seq_from')::int = 4 AND (provenance->>'seq_to')::int = 5"
             "  AND (provenance->>'forward_backward_ops')::int = 1 AND (provenance->'loss'->>'sum')::float8 = 1.25"
             "  AND provenance->'loss_fns' = '[\"importance_sampling\"]'"
             "  FROM adapter_versions WHERE id = %lld)", (long long)v1, (long long)v1, (long long)v2);
    CHECK(rc == 0 && !strcmp(text(q), "t"),
          "overwrite: old row deleted, new row's parent is it, range 4..5 counts only the completed fwd/bwd");
    rc = save(C, "sa:train:0", 6, "sampler", "000003", d2, false, -1, &v3, err, sizeof err);
    CHECK(rc == 0, "weights/ and sampler_weights/ are separate name spaces");

    /* lineage across models: sa:train:1 loads v2, then saves */
    snprintf(q, sizeof q, "INSERT INTO operations (request_id, tenant_id, model_id, seq_id, kind, payload, state)"
             " VALUES ('l1', 1, 'sa:train:1', 1, 'load_weights', '{\"version_id\": %lld}', 'done')", (long long)v2);
    sql(q);
    int64_t v4;
    rc = save(C, "sa:train:1", 2, "training", "child", d2, false, -1, &v4, err, sizeof err);
    snprintf(q, sizeof q, "SELECT parent_id = %lld AND (provenance->>'seq_from')::int = 2 FROM adapter_versions"
             " WHERE id = %lld", (long long)v2, (long long)v4);
    CHECK(rc == 0 && !strcmp(text(q), "t"), "a model started by load_weights: parent = the loaded version");
    snprintf(q, sizeof q, "SELECT ancestors::text FROM adapter_history WHERE version_id = %lld", (long long)v4);
    char want[64];
    snprintf(want, sizeof want, "{%lld,%lld}", (long long)v2, (long long)v1);
    CHECK(!strcmp(text(q), want), "adapter_history: ancestor chain %s", text(q));
    snprintf(q, sizeof q, "SELECT count(*) FROM adapter_versions_by_data_digest WHERE data_digest ="
             " (SELECT provenance->>'data_digest' FROM adapter_versions WHERE id = %lld)", (long long)v1);
    CHECK(scalar(q) == 1, "adapter_versions_by_data_digest finds the version trained on that data");
}

static void test_access(void) {
    char err[512];
    reg_version v;
    const char *path = "tinker://sa:train:0/weights/000003";
    CHECK(reg_find_readable(C, 1, path, &v, err, sizeof err) == 0 && v.tenant_id == 1 && v.rank == 8 &&
              !strcmp(v.kind, "training") && !strcmp(v.path.name, "000003"),
          "owner reads its checkpoint");
    CHECK(reg_find_readable(C, 2, path, &v, err, sizeof err) == 404, "another tenant: not found");
    CHECK(reg_find_owned(C, 2, path, &v, err, sizeof err) == 404, "another tenant cannot modify: not found");
    sql("INSERT INTO adapter_grants (adapter_id, tenant_id) SELECT id, 2 FROM adapters WHERE name = 'sa:train:0'");
    CHECK(reg_find_readable(C, 2, path, &v, err, sizeof err) == 0, "grant: tenant b reads");
    CHECK(reg_find_owned(C, 2, path, &v, err, sizeof err) == 403, "grant: tenant b still cannot modify (403)");
    CHECK(reg_find_readable(C, 3, path, &v, err, sizeof err) == 404, "tenant c: not found");
    sql("UPDATE adapter_versions SET visibility = 'public' WHERE tinker_path = 'tinker://sa:train:0/sampler_weights/000003'"
        " AND deleted_at IS NULL");
    CHECK(reg_find_readable(C, 3, "tinker://sa:train:0/sampler_weights/000003", &v, err, sizeof err) == 0 && v.is_public,
          "public: tenant c reads the published version");
    CHECK(reg_find_readable(C, 3, path, &v, err, sizeof err) == 404, "... but not the unpublished one");
    json_t *j = reg_checkpoint_json(&v);
    CHECK(!strcmp(json_string_value(json_object_get(j, "checkpoint_id")), "sampler_weights/000003") &&
              !strcmp(json_string_value(json_object_get(j, "checkpoint_type")), "sampler") &&
              json_is_true(json_object_get(j, "public")) && json_is_null(json_object_get(j, "expires_at")) &&
              strlen(json_string_value(json_object_get(j, "time"))) == 27,
          "Checkpoint JSON (§12.1)");
    json_decref(j);

    char d[BLOB_DIGEST_HEX];
    put("short lived", d);
    int64_t id;
    CHECK(save(C, "sa:train:0", 6, "sampler", "ttl", d, false, 1, &id, err, sizeof err) == 0, "save with ttl 1 s");
    CHECK(reg_find_readable(C, 1, "tinker://sa:train:0/sampler_weights/ttl", &v, err, sizeof err) == 0 &&
              v.expires_at[0], "readable before expiry (expires_at %s)", v.expires_at);
    sleep(2);
    CHECK(reg_find_readable(C, 1, "tinker://sa:train:0/sampler_weights/ttl", &v, err, sizeof err) == 404,
          "past its TTL: not found");
    CHECK(save(C, "sa:train:0", 6, "sampler", "ttl", d, false, -1, &id, err, sizeof err) == 0,
          "an expired name can be saved again without overwrite");
}

static void test_gc(void) {
    char err[512], dx[BLOB_DIGEST_HEX], dy[BLOB_DIGEST_HEX];
    put("gc x", dx);
    put("gc y", dy);
    int64_t id;
    /* run sa:train:1: five live training versions; x used by k1 only, y by k2 and k3 */
    save(C, "sa:train:1", 10, "training", "k1", dx, false, -1, &id, err, sizeof err);
    save(C, "sa:train:1", 11, "training", "k2", dy, false, -1, &id, err, sizeof err);
    save(C, "sa:train:1", 12, "training", "k3", dy, false, -1, &id, err, sizeof err);
    sql("UPDATE adapter_versions SET deleted_at = now() WHERE name IN ('k1', 'k2')");
    reg_gc_opts o = {0};
    reg_gc_stats st;
    CHECK(reg_gc(C, B, &o, &st, err, sizeof err) == 0, "gc pass: %s", err);
    CHECK(!blob_exists(B, dx) && blob_exists(B, dy), "gc removed x (no live user) and kept y (k3 uses it)");
    CHECK(scalar("SELECT count(*) FROM adapter_versions WHERE name = 'k1' AND blob_removed_at IS NOT NULL") == 1 &&
              scalar("SELECT count(*) FROM adapter_versions WHERE name = 'k2' AND blob_removed_at IS NULL") == 1,
          "blob_removed_at marks only the collected rows");
    CHECK(reg_gc(C, B, &o, &st, err, sizeof err) == 0 && st.blobs_removed == 0, "a second pass removes nothing");
    char de[BLOB_DIGEST_HEX];
    put("gc e", de);
    save(C, "sa:train:1", 13, "sampler", "e1", de, false, 3600, &id, err, sizeof err);
    sql("UPDATE adapter_versions SET expires_at = now() - interval '1 second' WHERE name = 'e1'");
    CHECK(reg_gc(C, B, &o, &st, err, sizeof err) == 0 && st.expired == 1 && !blob_exists(B, de) &&
              scalar("SELECT count(*) FROM adapter_versions WHERE name = 'e1' AND deleted_at IS NOT NULL") == 1 &&
              scalar("SELECT count(*) FROM audit_log WHERE action = 'checkpoint.expire'") == 1,
          "an expired version is marked deleted (audited) and its blob collected");

    char dz[BLOB_DIGEST_HEX];
    for (int i = 0; i < 4; i++) {
        char name[16], bytes[32];
        snprintf(name, sizeof name, "keep%d", i);
        snprintf(bytes, sizeof bytes, "keep blob %d", i);
        put(bytes, dz);
        save(C, "sa:train:1", 20 + i, "sampler", name, dz, false, -1, &id, err, sizeof err);
    }
    reg_gc_opts ok = {.keep_last = 2, .run = "sa:train:1"};
    CHECK(reg_gc(C, B, &ok, &st, err, sizeof err) == 0 && st.pruned == 2 && st.blobs_removed == 2,
          "keep-last 2 per run and kind: pruned %d sampler versions, removed %d blobs", st.pruned, st.blobs_removed);
    CHECK(scalar("SELECT count(*) FROM adapter_versions WHERE name IN ('keep2', 'keep3') AND deleted_at IS NULL") == 2 &&
              scalar("SELECT count(*) FROM audit_log WHERE action = 'checkpoint.prune'") == 2 &&
              scalar("SELECT count(*) FROM adapter_versions WHERE name IN ('child', 'k3') AND deleted_at IS NULL") == 2,
          "the newest two survive; prunes audited; the two live training versions untouched");
}

/* ---- GC racing saves -------------------------------------------------------------------- */

#define SAVERS 3
#define POOL (2 * SAVERS)   /* each saver alternates between two blobs of its own */
#define ROUNDS 60
static char pool_digest[POOL][BLOB_DIGEST_HEX];
static char pool_bytes[POOL][32];
static atomic_int next_seq = 1000, saver_errors, saves_done, gc_removed, stop_gc, lost_blobs;

static void *saver(void *arg) {
    int t = (int)(intptr_t)arg;
    char err[512];
    PGconn *c = db_connect(conninfo, 10000, err, sizeof err);
    for (int i = 0; i < ROUNDS; i++) {
        int k = 2 * t + i % 2;
        char dg[BLOB_DIGEST_HEX], name[32];
        /* as the executor: store the blob first, then (later) the row under the shared lock */
        if (blob_put(B, pool_bytes[k], strlen(pool_bytes[k]), dg, err, sizeof err) < 0) { saver_errors++; continue; }
        usleep(1000 + rand() % 4000);   /* the window in which GC may take the blob */
        snprintf(name, sizeof name, "race-%d-%d", t, i);
        reg_new_version v = {.model_id = "sa:train:0", .seq_id = atomic_fetch_add(&next_seq, 1), .kind = "sampler",
                             .name = name, .digest = dg, .size_bytes = 11, .ttl_seconds = -1};
        int64_t vid;
        if (db_begin(c, err, sizeof err) < 0 || reg_blob_lock_shared(c, dg, err, sizeof err) < 0) { saver_errors++; db_rollback(c); continue; }
        if (!blob_exists(B, dg) && blob_put(B, pool_bytes[k], strlen(pool_bytes[k]), dg, err, sizeof err) < 0) {
            saver_errors++;
            db_rollback(c);
            continue;
        }
        if (reg_version_insert(c, &v, &vid, err, sizeof err) != 0 || db_commit(c, err, sizeof err) < 0) {
            fprintf(stderr, "saver: %s\n", err);
            saver_errors++;
            db_rollback(c);
            continue;
        }
        saves_done++;
        /* Under the digest's shared lock GC cannot be half-way through removing it: if our
         * row is still live, its blob must be there. */
        char q[160];
        snprintf(q, sizeof q, "SELECT count(*) FROM adapter_versions v WHERE id = %lld AND " REG_LIVE, (long long)vid);
        if (db_begin(c, err, sizeof err) == 0 && reg_blob_lock_shared(c, dg, err, sizeof err) == 0) {
            PGresult *r = db_query(c, q, 0, NULL, err, sizeof err);
            if (r && db_int(r, 0, 0) == 1 && !blob_exists(B, dg)) lost_blobs++;
            if (r) PQclear(r);
        }
        db_rollback(c);
    }
    PQfinish(c);
    return NULL;
}

static void *collector(void *arg) {
    char err[512];
    PGconn *c = db_connect(conninfo, 10000, err, sizeof err);
    while (!stop_gc) {
        /* delete every live race version but the newest one of each blob, then collect */
        db_exec(c, "UPDATE adapter_versions SET deleted_at = now() WHERE name LIKE 'race-%' AND deleted_at IS NULL"
                   " AND random() < 0.7", 0, NULL, err, sizeof err);
        reg_gc_opts o = {0};
        reg_gc_stats st;
        if (reg_gc(c, B, &o, &st, err, sizeof err) < 0) fprintf(stderr, "gc: %s\n", err);
        gc_removed += st.blobs_removed;
        usleep(rand() % 1000);
    }
    PQfinish(c);
    return NULL;
}

static void test_gc_race(void) {
    for (int k = 0; k < POOL; k++) {
        snprintf(pool_bytes[k], sizeof pool_bytes[k], "race blob %d", k);
        put(pool_bytes[k], pool_digest[k]);
    }
    pthread_t s[SAVERS], g;
    pthread_create(&g, NULL, collector, NULL);
    for (int i = 0; i < SAVERS; i++) pthread_create(&s[i], NULL, saver, (void *)(intptr_t)i);
    for (int i = 0; i < SAVERS; i++) pthread_join(s[i], NULL);
    stop_gc = 1;
    pthread_join(g, NULL);
    CHECK(saver_errors == 0 && saves_done == SAVERS * ROUNDS, "%d concurrent saves committed", saves_done);
    CHECK(lost_blobs == 0, "no committed live version ever lost its blob (%d did)", (int)lost_blobs);
    CHECK(gc_removed > 0, "gc removed race blobs %d times meanwhile (the race was exercised)", (int)gc_removed);
    char err[512];
    PGresult *r = db_query(C, "SELECT DISTINCT blob_digest FROM adapter_versions v WHERE " REG_LIVE, 0, NULL, err,
                           sizeof err);
    int missing = 0, live = r ? PQntuples(r) : -1;
    for (int i = 0; r && i < PQntuples(r); i++) {
        void *data;
        size_t n;
        if (blob_get(B, PQgetvalue(r, i, 0), &data, &n, err, sizeof err) < 0) missing++;
        else free(data);
    }
    if (r) PQclear(r);
    CHECK(live > 0 && missing == 0, "every live version's blob is present and intact (%d digests, %d missing)", live,
          missing);
}

int main(void) {
    char dir[] = "/tmp/loom-regdb-XXXXXX", err[1024];
    if (!mkdtemp(dir)) return 2;
    chmod(dir, 0755);
    if (sodium_init() < 0) return 2;
    pgcluster pc;
    if (pgc_start(dir, &pc, err, sizeof err) < 0) { fprintf(stderr, "cluster: %s\n", err); return 2; }
    snprintf(conninfo, sizeof conninfo, "%s", pc.conninfo);
    C = db_connect(conninfo, 10000, err, sizeof err);
    if (!C || migrate_run(C, err, sizeof err) < 0) { fprintf(stderr, "db: %s\n", err); return 2; }
    char bdir[600];
    snprintf(bdir, sizeof bdir, "%s/blobs", dir);
    if (!(B = blob_open_dir(bdir, err, sizeof err))) { fprintf(stderr, "blobs: %s\n", err); return 2; }
    setup();
    test_versions();
    test_access();
    test_gc();
    test_gc_race();
    PQfinish(C);
    blob_close(B);
    pgc_stop(dir, err, sizeof err);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) {}
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
