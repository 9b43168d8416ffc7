/* test_gc_orphans.c: the orphan sweep of registry GC against a real PostgreSQL cluster
 * started for this test: the blob store's listing, stat and temp-file cleanup; orphan
 * blobs (no version row counts on them) removed once older than the grace period, young
 * ones and every blob a live version uses kept; a blob stored again gets a fresh mtime;
 * the `loom adapter gc --orphan-grace-s` command; and saves racing the sweep, each save
 * stalling between blob_put and its commit as long as the grace period (its blob's mtime
 * is set back), some refused because the name exists: no committed live version may lose
 * its blob, and at the end the store holds exactly the live versions' blobs. Last, a
 * sampler snapshot a draining executor handed over to the store: its blob is kept while
 * its sampling session names it, which the scheduler stops once the session expired and
 * none of its samples is pending. A copy (copy_weights) keeps its source's blob after the
 * source is deleted; an adapter upload that expired unfinished is dropped with its staged
 * files. */
#include "check.h"
#include "dbtest.h"
#include "regtest.h"
#include "scheduler/sched_sql.h"
#include <fcntl.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char bdir[700];

/* Sets a blob's (or any file's) mtime `age` seconds back. Quietly does nothing when the
 * file is gone (in the race, GC may have taken the blob already). */
static void age_file(const char *path, int age) {
    struct timespec ts[2] = {{.tv_sec = time(NULL) - age}, {.tv_sec = time(NULL) - age}};
    if (utimensat(AT_FDCWD, path, ts, 0) < 0) {}
}

static void age_blob(const char *digest, int age) {
    char p[1024];
    snprintf(p, sizeof p, "%s/sha256/%.2s/%s", bdir, digest, digest);
    age_file(p, age);
}

static int save(PGconn *c, const char *name, const char *digest, int64_t *vid, char *err, size_t errlen) {
    static atomic_int seq = 1;
    reg_new_version v = {.model_id = "sa:train:0", .seq_id = atomic_fetch_add(&seq, 1), .kind = "sampler",
                         .name = name, .digest = digest, .size_bytes = 10, .ttl_seconds = -1};
    return save_version(c, NULL, &v, vid, err, errlen);
}

static void setup(void) {
    sql("INSERT INTO tenants (name) VALUES ('a')");
    sql("INSERT INTO base_models (name, path, arch, max_context, vocab_size, config)"
        " VALUES ('m', '/x', 'LlamaForCausalLM', 128, 256, '{}')");
    sql("INSERT INTO sessions (id, tenant_id) VALUES ('sa', 1)");
    sql("INSERT INTO models (id, tenant_id, session_id, model_seq_id, base_model, lora_rank, lora_seed, train_attn,"
        " train_mlp, train_unembed) VALUES ('sa:train:0', 1, 'sa', 0, 'm', 8, 1, true, true, true)");
}

static bool listed(const blob_info *all, size_t n, const char *dg, int64_t size) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(all[i].digest, dg)) return all[i].size == size;
    return false;
}

static void test_store(void) {
    char err[512], d1[BLOB_DIGEST_HEX], d2[BLOB_DIGEST_HEX], p[1024];
    put("list one", d1);
    put("list two!", d2);
    /* something that is no blob: skipped by the listing */
    snprintf(p, sizeof p, "%s/sha256/%.2s/not-a-blob", bdir, d1);
    FILE *f = fopen(p, "w");
    if (f) fclose(f);
    blob_info *all;
    size_t n;
    CHECK(blob_list(B, &all, &n, err, sizeof err) == 0 && n == 2 && listed(all, n, d1, 8) && listed(all, n, d2, 9),
          "blob_list walks sha256/xx/: %zu blobs with their sizes, stray files skipped", n);
    free(all);
    unlink(p);
    blob_info bi;
    age_blob(d1, 500);
    CHECK(blob_stat(B, d1, &bi, err, sizeof err) == 0 && bi.size == 8 && bi.mtime <= time(NULL) - 499,
          "blob_stat reports size and mtime");
    char zero[BLOB_DIGEST_HEX];
    memset(zero, '0', 64);
    zero[64] = 0;
    CHECK(blob_stat(B, zero, &bi, err, sizeof err) == 1, "blob_stat of an absent blob says so");
    put("list one", d1);
    CHECK(blob_stat(B, d1, &bi, err, sizeof err) == 0 && bi.mtime >= time(NULL) - 5,
          "storing an existing blob again refreshes its mtime");
    blob_remove(B, d1, err, sizeof err);
    blob_remove(B, d2, err, sizeof err);

    snprintf(p, sizeof p, "%s/tmp/old.XXXXXX", bdir);
    int fd = mkstemp(p);
    if (fd >= 0) close(fd);
    age_file(p, 7200);
    char young[1024];
    snprintf(young, sizeof young, "%s/tmp/young.XXXXXX", bdir);
    fd = mkstemp(young);
    if (fd >= 0) close(fd);
    int removed = -1;
    CHECK(blob_clean_tmp(B, time(NULL) - 3600, true, &removed, err, sizeof err) == 0 && removed == 1 &&
              access(p, F_OK) == 0,
          "clean_tmp dry run counts the stale temp file (%d) and removes nothing", removed);
    CHECK(blob_clean_tmp(B, time(NULL) - 3600, false, &removed, err, sizeof err) == 0 && removed == 1 &&
              access(p, F_OK) != 0 && access(young, F_OK) == 0,
          "clean_tmp removes the temp file older than the grace and keeps the young one");
    unlink(young);
}

static void test_sweep(void) {
    char err[512], live[BLOB_DIGEST_HEX], old[BLOB_DIGEST_HEX], young[BLOB_DIGEST_HEX], dead[BLOB_DIGEST_HEX],
        again[BLOB_DIGEST_HEX], refused[BLOB_DIGEST_HEX];
    int64_t id;
    put("orphan live", live);
    save(C, "o-live", live, &id, err, sizeof err);
    put("orphan old", old);
    put("orphan young", young);
    put("orphan dead", dead);
    save(C, "o-dead", dead, &id, err, sizeof err);
    put("orphan again", again);
    save(C, "o-again", again, &id, err, sizeof err);
    sql("UPDATE adapter_versions SET deleted_at = now() WHERE name IN ('o-dead', 'o-again')");
    /* a save refused because the name is taken leaves its blob behind */
    put("orphan refused", refused);
    CHECK(save(C, "o-live", refused, &id, err, sizeof err) == 1, "a save under a taken name is refused");
    for (const char *d[] = {live, old, dead, again, refused}, **q = d; q < d + 5; q++) age_blob(*q, 7200);

    reg_gc_opts o = {.sweep_orphans = true, .orphan_grace_s = 3600, .dry_run = true};
    err[0] = 0;
    reg_gc_stats st;
    CHECK(reg_gc(C, B, &o, &st, err, sizeof err) == 0 && st.orphans_removed == 2 && st.orphans_young == 1 &&
              st.blobs_removed == 4 && blob_exists(B, old) && blob_exists(B, refused) && blob_exists(B, dead),
          "dry run: 2 dead versions' blobs + 2 old orphans would go, 1 young orphan stays (%d, %d, %d): %s",
          st.blobs_removed, st.orphans_removed, st.orphans_young, err);

    /* GC took the again blob; then a save stored it again and was refused: an orphan whose
     * only rows are marked blob_removed_at */
    o.dry_run = false;
    CHECK(reg_gc(C, B, &o, &st, err, sizeof err) == 0, "gc pass with orphan sweep: %s", err);
    CHECK(!blob_exists(B, old) && !blob_exists(B, refused) && !blob_exists(B, dead) && !blob_exists(B, again) &&
              blob_exists(B, young) && blob_exists(B, live),
          "old orphans and dead blobs removed; the young orphan and the live version's (old) blob kept");
    CHECK(st.orphans_removed == 2 && st.orphans_young == 1 && st.bytes_freed > 0,
          "stats: %d orphans removed, %d young kept, %lld bytes freed", st.orphans_removed, st.orphans_young,
          (long long)st.bytes_freed);
    put("orphan again", again);
    age_blob(again, 7200);
    CHECK(reg_gc(C, B, &o, &st, err, sizeof err) == 0 && !blob_exists(B, again) && st.orphans_removed == 1,
          "a blob stored again after GC took it, with only collected rows, is an orphan too");
    put("orphan old", old);
    age_blob(old, 7200);
    put("orphan old", old);   /* a new save reusing it refreshes the mtime */
    CHECK(reg_gc(C, B, &o, &st, err, sizeof err) == 0 && blob_exists(B, old) && st.orphans_young == 2,
          "an old orphan that a new save stores again is young again and kept");

    o.orphan_grace_s = 0;
    o.sweep_orphans = false;
    CHECK(reg_gc(C, B, &o, &st, err, sizeof err) == 0 && blob_exists(B, old) && st.orphans_removed == 0,
          "without sweep_orphans no orphan is touched");

    /* the command: default grace keeps young ones, --orphan-grace-s 0 sweeps them */
    const char *bin = getenv("LOOM_BIN");
    if (bin) {
        char cmd[3000];
        snprintf(cmd, sizeof cmd, "%s adapter gc --db '%s' --blob-dir %s > %s/gc.out 2>&1", bin, conninfo, bdir, bdir);
        int rc1 = system(cmd);
        bool kept = blob_exists(B, old) && blob_exists(B, young);
        sleep(1);   /* mtimes are whole seconds: let "now" pass the young blobs' */
        snprintf(cmd, sizeof cmd, "%s adapter gc --db '%s' --blob-dir %s --orphan-grace-s 0 > %s/gc.out 2>&1", bin,
                 conninfo, bdir, bdir);
        int rc2 = system(cmd);
        CHECK(rc1 == 0 && kept && rc2 == 0 && !blob_exists(B, old) && !blob_exists(B, young) && blob_exists(B, live),
              "loom adapter gc: default grace keeps young orphans, --orphan-grace-s 0 removes them (rc %d, %d)", rc1,
              rc2);
    } else {
        printf("skip  loom adapter gc command (LOOM_BIN not set)\n");
    }
}

/* ---- saves racing the sweep -------------------------------------------------------------- */

static void sweep_race_round(int t, int i, char bytes[48], char name[32]) {
    snprintf(bytes, 48, "race %d %d", t, i % 7);   /* some contents recur */
    /* every fifth save reuses a taken name and is refused, leaving an orphan */
    snprintf(name, 32, "race-%d-%d", t, i % 5 == 4 ? i - 1 : i);
}

static void sweep_race_stall(const char *digest) {
    age_blob(digest, 7200);   /* the save stalls as long as the grace period between put and commit */
    usleep(500 + rand() % 3000);
}

static void test_race(void) {
    race r = {.savers = 3, .rounds = 50, .p_delete = 0.3, .gc = {.sweep_orphans = true, .orphan_grace_s = 3600},
              .round = sweep_race_round, .stall = sweep_race_stall};
    race_run(&r);
    CHECK(r.errors == 0 && r.saved + r.refused == r.savers * r.rounds && r.refused > 0,
          "%d concurrent saves committed, %d refused (name taken)", (int)r.saved, (int)r.refused);
    CHECK(r.lost == 0, "no committed live version ever lost its blob to the sweep (%d did)", (int)r.lost);
    CHECK(r.orphans > 0, "the sweep removed orphans %d times meanwhile (the race was exercised)", (int)r.orphans);

    /* a last pass: the store holds exactly the live versions' blobs, all intact. The
     * collector may have marked every race version deleted (on a loaded machine it loops
     * many times per save): one more live version, saved now, keeps the check from being
     * about an empty set */
    char err[512] = "", kept[BLOB_DIGEST_HEX];
    int64_t kept_id;
    put("race: a version live at the end", kept);
    CHECK(save(C, "race-final", kept, &kept_id, err, sizeof err) == 0, "a last live version saved: %s", err);
    reg_gc_opts o = {.sweep_orphans = true, .orphan_grace_s = 3600};
    reg_gc_stats st;
    blob_info *all;
    size_t n;
    sql("UPDATE adapter_versions SET deleted_at = now() WHERE name = 'o-live'");
    int rc = reg_gc(C, B, &o, &st, err, sizeof err);
    /* the young orphans of test_sweep are gone already (grace 0 there); age what is left */
    if (blob_list(B, &all, &n, err, sizeof err) == 0) {
        for (size_t i = 0; i < n; i++) age_blob(all[i].digest, 7200);
        free(all);
    }
    rc = rc || reg_gc(C, B, &o, &st, err, sizeof err);
    int nlive, missing = live_blobs_missing(&nlive);
    bool listed_ok = blob_list(B, &all, &n, err, sizeof err) == 0;
    if (listed_ok) free(all);
    CHECK(rc == 0 && nlive > 0 && missing == 0 && listed_ok && (int)n == nlive,
          "after a final pass the store holds exactly the %d live blobs (%zu stored, %d missing)", nlive, n, missing);
}

static void test_sampler_snapshot(void) {
    char err[512] = "", dg[BLOB_DIGEST_HEX], q[512];
    put("handed-over sampler snapshot", dg);
    age_blob(dg, 7200);
    snprintf(q, sizeof q, "INSERT INTO sampling_sessions (id, tenant_id, session_id, seq_id, base_model,"
             " source_model_id, source_seq_id, snapshot_digest) VALUES ('sa:sample:0', 1, 'sa', 0, 'm', 'sa:train:0',"
             " 1, '%s')", dg);
    sql(q);
    sql("INSERT INTO operations (request_id, tenant_id, sampling_session_id, seq_id, kind, payload)"
        " VALUES ('req-hs', 1, 'sa:sample:0', 0, 'sample', '{}')");
    reg_gc_opts o = {.sweep_orphans = true, .orphan_grace_s = 0};
    reg_gc_stats st;
    CHECK(reg_gc(C, B, &o, &st, err, sizeof err) == 0 && blob_exists(B, dg),
          "GC keeps the blob of a sampler snapshot its sampling session names: %s", err);
    sql("UPDATE sessions SET expired_at = now() WHERE id = 'sa'");
    sql(SQL_DROP_EXPIRED_SAMPLER_SNAPSHOTS);
    CHECK(scalar("SELECT count(*) FROM sampling_sessions WHERE snapshot_digest IS NOT NULL") == 1,
          "the session expired, but a sample of the sampler is still queued: its snapshot stays");
    sql("UPDATE operations SET state = 'canceled' WHERE request_id = 'req-hs'");
    sql(SQL_DROP_EXPIRED_SAMPLER_SNAPSHOTS);
    CHECK(scalar("SELECT count(*) FROM sampling_sessions WHERE snapshot_digest IS NOT NULL") == 0,
          "once nothing of it is pending, the scheduler lets go of the snapshot of the expired session");
    CHECK(reg_gc(C, B, &o, &st, err, sizeof err) == 0 && !blob_exists(B, dg), "and GC removes its blob: %s", err);
}

/* copy_weights (docs/protocol.md §7.10): a copy is a version row naming the source's blob.
 * GC keeps the blob while the copy lives, after the source is deleted and aged past the
 * orphan grace, and takes it once the copy goes too. */
static void test_copy(void) {
    char err[512] = "", dg[BLOB_DIGEST_HEX], path[REG_PATH_MAX];
    int64_t vid;
    put("a checkpoint that gets copied", dg);
    reg_new_version v = {.model_id = "sa:train:0", .seq_id = 900, .kind = "sampler", .name = "tocopy", .digest = dg,
                         .size_bytes = 29, .ttl_seconds = -1};
    CHECK(save_version(C, NULL, &v, &vid, err, sizeof err) == 0, "the source is saved: %s", err);
    reg_version src;
    int rc = reg_find_live(C, "tinker://sa:train:0/sampler_weights/tocopy", &src, err, sizeof err);
    rc = rc || db_begin(C, err, sizeof err) || reg_blob_lock_shared(C, dg, err, sizeof err) ||
         reg_copy(C, &src, 1, "sa:train:5", -1, 0, path, err, sizeof err) || db_commit(C, err, sizeof err);
    if (rc) db_rollback(C);
    CHECK(rc == 0 && !strcmp(path, "tinker://sa:train:5/sampler_weights/tocopy"), "reg_copy makes %s: %s", path, err);
    char q[512];
    snprintf(q, sizeof q, "SELECT count(*) FROM adapter_versions WHERE blob_digest = '%s' AND parent_id = %lld", dg,
             (long long)vid);
    CHECK(scalar(q) == 1, "one more row names the blob, its parent the source");
    snprintf(q, sizeof q, "UPDATE adapter_versions SET deleted_at = now() WHERE id = %lld", (long long)vid);
    sql(q);
    age_blob(dg, 7200);
    reg_gc_opts o = {.sweep_orphans = true, .orphan_grace_s = 0};
    reg_gc_stats st;
    CHECK(reg_gc(C, B, &o, &st, err, sizeof err) == 0 && blob_exists(B, dg),
          "source deleted and its blob old: GC keeps the blob the copy names: %s", err);
    sql("UPDATE adapter_versions SET deleted_at = now() WHERE tinker_path = 'tinker://sa:train:5/sampler_weights/tocopy'");
    CHECK(reg_gc(C, B, &o, &st, err, sizeof err) == 0 && !blob_exists(B, dg), "the copy deleted too: GC removes it: %s",
          err);
}

/* Adapter uploads (§12.5): GC drops an upload that expired unfinished with its staged
 * files, and leaves an open one alone. */
static void test_uploads(void) {
    char err[512] = "", name[2][128], path[1024];
    reg_upload_stage_name("upl-old", 1, name[0]);
    reg_upload_stage_name("upl-open", 1, name[1]);
    for (int i = 0; i < 2; i++)
        CHECK(blob_stage_put(B, name[i], "staged bytes", 12, err, sizeof err) == 0, "staged %s: %s", name[i], err);
    sql("INSERT INTO weight_uploads (id, tenant_id, base_model, expires_at) VALUES"
        " ('upl-old', 1, 'm', now() - interval '1 second'), ('upl-open', 1, 'm', now() + interval '1 hour')");
    reg_gc_opts o = {.sweep_orphans = true, .orphan_grace_s = 3600};
    reg_gc_stats st;
    int rc = reg_gc(C, B, &o, &st, err, sizeof err);
    snprintf(path, sizeof path, "%s/tmp/%s", bdir, name[0]);
    bool old_gone = access(path, F_OK) != 0;
    snprintf(path, sizeof path, "%s/tmp/%s", bdir, name[1]);
    bool open_kept = access(path, F_OK) == 0;
    CHECK(rc == 0 && st.uploads_expired == 1 && old_gone && open_kept &&
          scalar("SELECT count(*) FROM weight_uploads") == 1,
          "GC drops the expired upload and its staged file, keeps the open one (%d dropped): %s", st.uploads_expired,
          err);
}

int main(void) {
    char err[1024];
    if (sodium_init() < 0) return 2;
    srand((unsigned)time(NULL));
    dbt_start("loom-gcorph");
    snprintf(bdir, sizeof bdir, "%s/blobs", dbt_dir);
    if (!(B = blob_open_dir(bdir, err, sizeof err))) dbt_die("blobs", err);
    setup();
    test_store();
    test_sweep();
    test_race();
    test_sampler_snapshot();
    test_copy();
    test_uploads();
    blob_close(B);
    dbt_stop();
    return check_summary();
}
