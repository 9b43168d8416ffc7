/* test_registry_db.c: the registry against a real PostgreSQL cluster started for this
 * test: version rows with provenance (op range since the parent, hyper-parameters, loss
 * summary, data digest), name clashes and overwrite, lineage across load_weights, the
 * access rules between tenants (own / grant / public, read-only for non-owners), TTL,
 * the operator views, GC with keep-last, and GC racing concurrent saves that reuse the
 * same blobs: a live version's blob must never disappear. */
#include "check.h"
#include "contract/fb_payload.h"
#include "dbtest.h"
#include "regtest.h"
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int save(PGconn *c, const char *model, int seq, const char *kind, const char *name, const char *digest,
                bool overwrite, int64_t ttl, int64_t *vid, char *err, size_t errlen) {
    reg_new_version v = {.model_id = model, .seq_id = seq, .kind = kind, .name = name, .digest = digest,
                         .size_bytes = 100, .step = seq, .ttl_seconds = ttl, .overwrite = overwrite};
    return save_version(c, NULL, &v, vid, err, errlen);
}

/* The packed arrays of a one-datum forward_backward (contract/fb_payload.h), as the api writes them. */
static void set_payload_bin(const char *request_id, loss_kind loss, int64_t *tokens, int64_t *targets, size_t n) {
    fb_request r = {.loss = loss, .n_data = 1};
    fb_datum d = {.tokens = tokens, .n_tokens = n};
    d.in[LOSS_IN_TARGET_TOKENS] = (fb_tensor){.present = true, .n = n, .k = 1, .dims = 1, .i = targets};
    r.data = &d;
    fb_payload p;
    fb_payload_encode(&r, &p);
    char q[512];
    int at = snprintf(q, sizeof q, "UPDATE operations SET payload_bin = '\\x");
    for (size_t i = 0; i < p.bin_len; i++) at += snprintf(q + at, sizeof q - at, "%02x", p.bin[i]);
    snprintf(q + at, sizeof q - at, "' WHERE request_id = '%s'", request_id);
    sql(q);
    fb_payload_free(&p);
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
        " ('r1', 1, 'sa:train:0', 1, 'forward_backward', '{\"datums\": 1, \"loss_fn\": \"cross_entropy\"}', 3, 'done',"
        "   '{\"metrics\": {\"loss:sum\": 3.5}}'),"
        " ('r2', 1, 'sa:train:0', 2, 'optim_step', '{\"adam_params\": {\"learning_rate\": 0.01}}', 0, 'done', '{}'),"
        " ('r4', 1, 'sa:train:0', 4, 'forward_backward', '{\"datums\": 1, \"loss_fn\": \"importance_sampling\"}', 1,"
        "   'done', '{\"metrics\": {\"loss:sum\": 1.25}}'),"
        " ('r5', 1, 'sa:train:0', 5, 'forward_backward', '{\"datums\": 1}', 1, 'failed', NULL)");
    set_payload_bin("r1", LOSS_CROSS_ENTROPY, (int64_t[]){1, 2, 3}, (int64_t[]){2, 3, 4}, 3);
    set_payload_bin("r4", LOSS_IMPORTANCE_SAMPLING, (int64_t[]){5}, (int64_t[]){6}, 1);
    set_payload_bin("r5", LOSS_CROSS_ENTROPY, (int64_t[]){9}, (int64_t[]){9}, 1);
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
    snprintf(q, sizeof q, "SELECT provenance->>'data_digest' = encode(sha256(substring((SELECT payload_bin"
             " FROM operations WHERE request_id = 'r1') FROM %d)), 'hex') FROM adapter_versions WHERE id = %lld",
             FB_PAYLOAD_DATA_AT + 1, (long long)v1);
    CHECK(!strcmp(text(q), "t"), "data digest = sha256 of the consumed data (the packed datums, not the loss)");
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
          "Checkpoint JSON (docs/protocol.md §12.1)");
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

/* Each saver alternates between two blobs of its own, so that GC finds blobs whose
 * versions were all deleted while a save is about to reuse them. */
static char pool_bytes[6][32];

static void gc_race_round(int t, int i, char bytes[48], char name[32]) {
    snprintf(bytes, 48, "%s", pool_bytes[2 * t + i % 2]);
    snprintf(name, 32, "race-%d-%d", t, i);
}

static void gc_race_stall(const char *digest) {
    usleep(1000 + rand() % 4000);   /* the window in which GC may take the blob */
}

static void test_gc_race(void) {
    race r = {.savers = 3, .rounds = 60, .p_delete = 0.7, .round = gc_race_round, .stall = gc_race_stall};
    for (int k = 0; k < 2 * r.savers; k++) {
        char digest[BLOB_DIGEST_HEX];
        snprintf(pool_bytes[k], sizeof pool_bytes[k], "race blob %d", k);
        put(pool_bytes[k], digest);
    }
    race_run(&r);
    CHECK(r.errors == 0 && r.saved == r.savers * r.rounds, "%d concurrent saves committed", (int)r.saved);
    CHECK(r.lost == 0, "no committed live version ever lost its blob (%d did)", (int)r.lost);
    CHECK(r.removed > 0, "gc removed race blobs %d times meanwhile (the race was exercised)", (int)r.removed);
    int live, missing = live_blobs_missing(&live);
    CHECK(live > 0 && missing == 0, "every live version's blob is present and intact (%d digests, %d missing)", live,
          missing);
}

int main(void) {
    char err[1024];
    if (sodium_init() < 0) return 2;
    dbt_start("loom-regdb");
    char bdir[600];
    snprintf(bdir, sizeof bdir, "%s/blobs", dbt_dir);
    if (!(B = blob_open_dir(bdir, err, sizeof err))) dbt_die("blobs", err);
    setup();
    test_versions();
    test_access();
    test_gc();
    test_gc_race();
    blob_close(B);
    dbt_stop();
    return check_summary();
}
