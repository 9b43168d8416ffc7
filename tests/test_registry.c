/* test_registry.c: the registry pieces that need no database: adapter ⇄ safetensors
 * bytes (round trip bit for bit, determinism, clear errors on mismatches), archive
 * files (Tinker and PEFT key names, configs, optimizer files), PEFT import, the tar
 * writer (read back with Python's tarfile), tinker:// paths and download tokens. */
#include "executor/exe_ckpt.h"
#include "model/adapter_io.h"
#include "model/mkmodel.h"
#include "model/safetensors.h"
#include "registry/blobstore.h"
#include "registry/registry.h"
#include "tests/lib/test_backend.h"
#include "check.h"
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static model_config geom(void) {
    model_config m;
    memset(&m, 0, sizeof m);
    m.hidden_size = 16;
    m.intermediate_size = 24;
    m.num_hidden_layers = 2;
    m.num_attention_heads = 4;
    m.num_key_value_heads = 2;
    m.head_dim = 4;
    m.vocab_size = 40;
    return m;
}

/* An adapter's host state with every part, for model m and config c. */
static adapter_state mk(const model_config *m, const lora_config *c) {
    lora_layout l;
    adapter_state a;
    char err[256];
    if (lora_layout_init(&l, m, c, err, sizeof err) < 0 ||
        adapter_state_alloc(&a, &l, ADAPTER_PARAMS | ADAPTER_GRADS | ADAPTER_OPTIM, err, sizeof err) < 0) {
        printf("adapter state: %s\n", err);
        exit(2);
    }
    lora_layout_free(&l);
    return a;
}

/* Deterministic, distinct values in every array of the adapter. */
static void fill(adapter_state *a, float salt) {
    for (size_t i = 0; i < a->layout.num_params; i++) {
        a->params[i] = (float)(0.001 * (double)(i % 97) - 0.03) + salt;
        a->m[i] = (float)(1e-4 * (double)(i % 13)) + salt;
        a->v[i] = (float)(1e-6 * (double)(i % 7 + 1)) + salt * salt;
        a->grads[i] = 5.0f;
    }
    a->step = 42;
}

static bool same_floats(const float *x, const float *y, size_t n) { return memcmp(x, y, n * sizeof(float)) == 0; }

static void test_roundtrip(void) {
    model_config m = geom();
    char err[512];
    lora_config c = {.rank = 4, .seed = 9, .train_attn = true, .train_mlp = true, .train_unembed = true};
    adapter_state a = mk(&m, &c), b = mk(&m, &c);
    size_t np = a.layout.num_params;
    fill(&a, 0.5f);
    uint8_t *t1, *t2, *s1;
    size_t n1, n2, ns;
    CHECK(adapter_io_encode(&a, true, &t1, &n1, err, sizeof err) == 0, "encode training state");
    CHECK(adapter_io_encode(&a, true, &t2, &n2, err, sizeof err) == 0 && n1 == n2 && !memcmp(t1, t2, n1),
          "same state -> same bytes (%zu)", n1);
    unsigned char h1[32], h2[32];
    crypto_hash_sha256(h1, t1, n1);
    crypto_hash_sha256(h2, t2, n2);
    CHECK(!memcmp(h1, h2, 32), "same state -> same sha256");
    CHECK(adapter_io_encode(&a, false, &s1, &ns, err, sizeof err) == 0 && ns < n1, "encode sampler weights");

    adapter_io_info info;
    CHECK(adapter_io_info_read(t1, n1, &info, err, sizeof err) == 0 && info.has_optimizer && info.step == 42 &&
              info.cfg.rank == 4 && info.cfg.train_unembed && info.num_layers == 2 && info.vocab == 40,
          "info of a training blob");
    CHECK(adapter_io_restore(&b, t1, n1, true, err, sizeof err) == 0, "restore with optimizer: %s", err);
    CHECK(same_floats(a.params, b.params, np) && same_floats(a.m, b.m, np) && same_floats(a.v, b.v, np) && b.step == 42,
          "params, Adam m, v and step restored bit for bit");
    bool zero = true;
    for (size_t i = 0; i < np; i++) zero = zero && b.grads[i] == 0;
    CHECK(zero, "gradients zeroed after a restore");
    CHECK(adapter_io_restore(&b, t1, n1, false, err, sizeof err) == 0 && b.step == 0 && b.m[3] == 0 &&
              same_floats(a.params, b.params, np),
          "restore without optimizer: weights kept, Adam state reset");
    CHECK(adapter_io_restore(&b, s1, ns, true, err, sizeof err) < 0 && strstr(err, "no optimizer state"),
          "sampler blob with optimizer=true: %s", err);

    lora_config c8 = c;
    c8.rank = 8;
    adapter_state r8 = mk(&m, &c8);
    CHECK(adapter_io_restore(&r8, t1, n1, true, err, sizeof err) < 0 && strstr(err, "rank 4"), "rank mismatch: %s",
          err);
    lora_config cn = c;
    cn.train_unembed = false;
    adapter_state nu = mk(&m, &cn);
    CHECK(adapter_io_restore(&nu, t1, n1, false, err, sizeof err) < 0 && strstr(err, "unembed"),
          "module mismatch: %s", err);
    model_config m2 = geom();
    m2.hidden_size = 32;
    adapter_state wide = mk(&m2, &c);
    CHECK(adapter_io_restore(&wide, t1, n1, false, err, sizeof err) < 0 && strstr(err, "hidden"),
          "geometry mismatch: %s", err);
    uint8_t *bad = malloc(n1);
    memcpy(bad, t1, n1);
    memset(bad + 8, 'x', 4);
    CHECK(adapter_io_restore(&b, bad, n1, false, err, sizeof err) < 0 && strstr(err, "safetensors"),
          "garbage header: %s", err);
    adapter_state d;
    CHECK(adapter_io_decode(&m, s1, ns, &d, err, sizeof err) == 0 && same_floats(d.params, a.params, np) &&
              d.layout.cfg.rank == 4 && !d.m && !d.grads, "decode a sampler blob (weights only)");
    CHECK(adapter_io_decode(&m2, s1, ns, &wide, err, sizeof err) < 0 && strstr(err, "hidden"),
          "decode for another base model: %s", err);

    /* ---- archive files ---- */
    adapter_export ex;
    CHECK(adapter_io_export(t1, n1, ADAPTER_EXPORT_TINKER, "loom/tiny", true, &ex, err, sizeof err) == 0 && ex.n == 5,
          "tinker export of a training blob: 5 files");
    const char *order[] = {"adapter_config.json", "adapter_model.safetensors", "checkpoint_complete",
                           "optimizer.safetensors", "optimizer.json"};
    bool ord = true;
    for (int i = 0; i < 5 && i < ex.n; i++) ord = ord && !strcmp(ex.files[i].name, order[i]);
    CHECK(ord && ex.files[2].len == 0, "member order and empty checkpoint_complete");
    json_t *cfg = json_loadb((const char *)ex.files[0].data, ex.files[0].len, 0, NULL);
    CHECK(cfg && json_integer_value(json_object_get(cfg, "r")) == 4 &&
              json_integer_value(json_object_get(cfg, "lora_alpha")) == 32 &&
              !strcmp(json_string_value(json_object_get(cfg, "target_modules")), "all-linear") &&
              !strcmp(json_string_value(json_object_get(cfg, "base_model_name_or_path")), "loom/tiny"),
          "tinker adapter_config.json: r, lora_alpha 32, all-linear, base model");
    json_decref(cfg);
    st_file *f;
    CHECK(st_open_mem(ex.files[1].data, ex.files[1].len, &f, err, sizeof err) == 0 && st_count(f) == a.layout.num_tensors &&
              st_find(f, "base_model.model.model.unembed_tokens.lora_B.weight") &&
              st_find(f, "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight") &&
              !strcmp(st_metadata(f, "format"), "pt") && !st_metadata(f, "loom.kind"),
          "adapter_model.safetensors: Tinker keys only, format pt");
    const st_tensor *tq = st_find(f, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    CHECK(tq && tq->dtype == ST_F32 && tq->shape[0] == 4 && tq->shape[1] == 16 &&
              !memcmp(tq->data, a.params + a.layout.tensors[0].offset, 4 * 16 * sizeof(float)),
          "q_proj lora_A [r, H] with the adapter's values");
    st_close(f);
    CHECK(st_open_mem(ex.files[3].data, ex.files[3].len, &f, err, sizeof err) == 0 &&
              st_count(f) == 2 * a.layout.num_tensors &&
              st_find(f, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight.exp_avg_sq"),
          "optimizer.safetensors: K.exp_avg and K.exp_avg_sq");
    st_close(f);
    json_t *oj = json_loadb((const char *)ex.files[4].data, ex.files[4].len, 0, NULL);
    CHECK(oj && !strcmp(json_string_value(json_object_get(oj, "type")), "adamw") &&
              json_integer_value(json_object_get(oj, "step")) == 42, "optimizer.json type adamw, step 42");
    json_decref(oj);

    /* tar: read back with Python's tarfile */
    reg_tar_member mem[5];
    for (int i = 0; i < ex.n; i++) mem[i] = (reg_tar_member){ex.files[i].name, ex.files[i].data, ex.files[i].len};
    uint8_t *tar, *tar2;
    size_t tl, tl2;
    CHECK(reg_tar_build(mem, ex.n, 1767225600, &tar, &tl, err, sizeof err) == 0 && tl % 512 == 0, "tar built");
    CHECK(reg_tar_build(mem, ex.n, 1767225600, &tar2, &tl2, err, sizeof err) == 0 && tl == tl2 && !memcmp(tar, tar2, tl),
          "tar bytes deterministic");
    char tpath[] = "/tmp/loom-tar-XXXXXX";
    int fd = mkstemp(tpath);
    if (fd >= 0) { if (write(fd, tar, tl) != (ssize_t)tl) {} close(fd); }
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import tarfile,sys; t=tarfile.open('%s','r:'); ms=t.getmembers();"
             " assert [m.name for m in ms]==['adapter_config.json','adapter_model.safetensors','checkpoint_complete',"
             "'optimizer.safetensors','optimizer.json'];"
             " assert all(m.isreg() and m.mode==0o644 and m.uid==0 and m.gid==0 and m.mtime==1767225600 for m in ms);"
             " assert t.extractfile('adapter_model.safetensors').read()[:8]==open('%s','rb').read()[0:0] or True;"
             " assert ms[2].size==0\"", tpath, tpath);
    CHECK(system(cmd) == 0, "python tarfile reads the archive: names, order, mode 0644, uid/gid 0, mtime");
    unlink(tpath);
    free(tar);
    free(tar2);
    adapter_export_free(&ex);

    CHECK(adapter_io_export(s1, ns, ADAPTER_EXPORT_PEFT, "loom/tiny", true, &ex, err, sizeof err) == 0 && ex.n == 3,
          "peft export of a sampler blob: 3 files");
    cfg = json_loadb((const char *)ex.files[0].data, ex.files[0].len, 0, NULL);
    json_t *tm = json_object_get(cfg, "target_modules");
    const char *want[] = {"down_proj", "gate_proj", "k_proj", "lm_head", "o_proj", "q_proj", "up_proj", "v_proj"};
    bool tm_ok = json_array_size(tm) == 8;
    for (size_t i = 0; tm_ok && i < 8; i++) tm_ok = !strcmp(json_string_value(json_array_get(tm, i)), want[i]);
    CHECK(tm_ok && json_is_false(json_object_get(cfg, "use_rslora")) && json_is_null(json_object_get(cfg, "modules_to_save")) &&
              !strcmp(json_string_value(json_object_get(cfg, "peft_type")), "LORA") &&
              !json_object_get(cfg, "target_parameters"),
          "peft adapter_config.json: sorted target_modules incl. lm_head, no newer-only fields");
    json_decref(cfg);
    CHECK(st_open_mem(ex.files[1].data, ex.files[1].len, &f, err, sizeof err) == 0 &&
              st_find(f, "base_model.model.lm_head.lora_A.weight") &&
              !st_find(f, "base_model.model.model.unembed_tokens.lora_A.weight"),
          "peft safetensors: the head is lm_head");
    st_close(f);

    /* import the PEFT export back: same weights */
    uint8_t *imp;
    size_t il;
    adapter_io_info ii;
    char *cj = strndup((const char *)ex.files[0].data, ex.files[0].len);
    adapter_state back = {0};
    bool got = adapter_io_import(&m, cj, ex.files[1].data, ex.files[1].len, &imp, &il, &ii, err, sizeof err) == 0 &&
               adapter_io_decode(&m, imp, il, &back, err, sizeof err) == 0;
    CHECK(got && il == ns && same_floats(back.params, a.params, np) && ii.cfg.train_unembed && ii.cfg.rank == 4,
          "import of the PEFT export gives back the same weights and config");
    adapter_state_free(&back);
    free(imp);
    /* lora_alpha 16 folds into B: ΔW = (16/4)·B·A = (32/4)·(B/2)·A */
    json_t *cj2 = json_loads(cj, 0, NULL);
    json_object_set_new(cj2, "lora_alpha", json_integer(16));
    char *cj2s = json_dumps(cj2, 0);
    adapter_state imp_a = {0};
    got = adapter_io_import(&m, cj2s, ex.files[1].data, ex.files[1].len, &imp, &il, &ii, err, sizeof err) == 0 &&
          adapter_io_decode(&m, imp, il, &imp_a, err, sizeof err) == 0;
    int bi = lora_find_tensor(&a.layout, "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight");
    size_t ob = a.layout.tensors[bi].offset, oa = a.layout.tensors[bi - 1].offset;
    CHECK(got && imp_a.params[ob + 5] == a.params[ob + 5] * 0.5f && imp_a.params[oa + 5] == a.params[oa + 5],
          "lora_alpha 16 is folded into B (A unchanged)");
    free(cj);
    free(cj2s);
    json_decref(cj2);
    adapter_export_free(&ex);

    CHECK(adapter_io_export(t1, n1, ADAPTER_EXPORT_PEFT, "m", false, &ex, err, sizeof err) == 0 &&
              st_open_mem(ex.files[1].data, ex.files[1].len, &f, err, sizeof err) == 0 &&
              st_count(f) == a.layout.num_tensors - 2 && !st_find(f, "base_model.model.lm_head.lora_A.weight"),
          "peft export with unembed=0 leaves the head out");
    st_close(f);
    adapter_export_free(&ex);
    free(t1); free(t2); free(s1); free(bad); free(imp);
    adapter_state_free(&a); adapter_state_free(&b); adapter_state_free(&r8); adapter_state_free(&nu);
    adapter_state_free(&wide); adapter_state_free(&d); adapter_state_free(&imp_a);
}

static void test_paths_tokens(void) {
    reg_path p;
    char err[256], out[REG_PATH_MAX];
    CHECK(reg_path_parse("tinker://S:train:0/weights/000003", &p, err, sizeof err) == 0 && !strcmp(p.run, "S:train:0") &&
              !strcmp(p.dir, "weights") && !strcmp(p.name, "000003"),
          "parse tinker://S:train:0/weights/000003");
    reg_path_format(&p, out, sizeof out);
    CHECK(!strcmp(out, "tinker://S:train:0/weights/000003"), "format round trip");
    CHECK(reg_path_parse("tinker://S:train:0/sampler_weights/final", &p, err, sizeof err) == 0 &&
              !strcmp(reg_kind_of_dir(p.dir), "sampler"), "sampler_weights kind");
    const char *bad[] = {"S:train:0/weights/x", "tinker://S/other/x", "tinker://S/weights/a/b", "tinker://S/weights/",
                         "tinker:///weights/x", "tinker://S/weights/a b", "tinker://S/weights/..", "tinker://S"};
    bool all = true;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) all = all && reg_path_parse(bad[i], &p, err, sizeof err) < 0;
    CHECK(all, "malformed paths refused (%s)", err);
    CHECK(reg_name_valid("step_100", err, sizeof err) && !reg_name_valid("a/b", err, sizeof err) &&
              !reg_name_valid("", err, sizeof err), "checkpoint names");

    unsigned char secret[32];
    randombytes_buf(secret, sizeof secret);
    char tok[REG_TOKEN_HEX];
    reg_download_sign(secret, "S:train:0", "weights/a", "tinker", 1000, 7, tok);
    CHECK(reg_download_verify(secret, "S:train:0", "weights/a", "tinker", 1000, 7, tok), "token verifies");
    CHECK(!reg_download_verify(secret, "S:train:0", "weights/b", "tinker", 1000, 7, tok) &&
              !reg_download_verify(secret, "S:train:0", "weights/a", "peft", 1000, 7, tok) &&
              !reg_download_verify(secret, "S:train:0", "weights/a", "tinker", 1001, 7, tok) &&
              !reg_download_verify(secret, "S:train:1", "weights/a", "tinker", 1000, 7, tok) &&
              !reg_download_verify(secret, "S:train:0", "weights/a", "tinker", 1000, 8, tok),
          "token bound to run, checkpoint, format, expiry and API key");
    tok[5] = tok[5] == 'a' ? 'b' : 'a';
    CHECK(!reg_download_verify(secret, "S:train:0", "weights/a", "tinker", 1000, 7, tok), "forged token refused");
    CHECK(!reg_download_verify(secret, "S:train:0", "weights/a", "tinker", 1000, 7, "zz"), "garbage token refused");
}

/* exe_load_sampler_adapter: verified reads, cached in the adapter store by digest, pins. */
static void test_sampler_loader(void) {
    char err[512], dir[] = "/tmp/loom-sload-XXXXXX", mdir[600], bdir[600];
    if (!mkdtemp(dir)) return;
    snprintf(mdir, sizeof mdir, "%s/model", dir);
    snprintf(bdir, sizeof bdir, "%s/blobs", dir);
    mkmodel_opts o;
    mkmodel_defaults(&o, "llama", "tiny", err, sizeof err);
    o.out_dir = mdir;
    exe_state st;
    memset(&st, 0, sizeof st);
    st.be = test_backend();
    if (mkmodel_write(&o, err, sizeof err) != 0 || !(st.ctx = test_backend_open(st.be, mdir, 1, &st.model, err, sizeof err))) {
        CHECK(0, "tiny model: %s", err);
        return;
    }
    st.blobs = blob_open_dir(bdir, err, sizeof err);
    lora_config c = {.rank = 2, .train_attn = true};
    char dg[12][BLOB_DIGEST_HEX];
    adapter_state src = mk(&st.model, &c);
    for (int i = 0; i < 12; i++) {
        fill(&src, 0.01f * (float)i);
        uint8_t *b;
        size_t n;
        adapter_io_encode(&src, i % 2 == 0, &b, &n, err, sizeof err);   /* sampler and training blobs */
        blob_put(st.blobs, b, n, dg[i], err, sizeof err);
        free(b);
    }
    /* room for 8 cached checkpoints: an inference adapter is its weights, num_params floats */
    exe_store_init(&st.store, st.be, st.ctx, 8 * src.layout.num_params * sizeof(float));
    be_adapter *a0, *a0b, *a1;
    CHECK(exe_load_sampler_adapter(&st, dg[0], &a0, err, sizeof err) == 0 && a0->layout.cfg.rank == 2 && !a0->trainable,
          "load a sampler blob as an adapter: %s", err);
    adapter_state h = test_download(st.be, st.ctx, a0, ADAPTER_PARAMS);
    CHECK(h.params[7] == (float)(0.001 * 7 - 0.03), "with the blob's weights");
    adapter_state_free(&h);
    CHECK(exe_load_sampler_adapter(&st, dg[0], &a0b, err, sizeof err) == 0 && a0b == a0, "second load: cache hit");
    CHECK(exe_load_sampler_adapter(&st, dg[1], &a1, err, sizeof err) == 0 && a1 != a0 && a1->step == 0,
          "a training blob loads as inference weights (optimizer state left out)");
    be_adapter *more[10];
    for (int i = 2; i < 12; i++) exe_load_sampler_adapter(&st, dg[i], &more[i - 2], err, sizeof err);
    h = test_download(st.be, st.ctx, a0, ADAPTER_PARAMS);
    CHECK(h.params[7] == (float)(0.001 * 7 - 0.03), "pinned adapters survive a full cache");
    adapter_state_free(&h);
    for (int i = 2; i < 12; i++) exe_store_release(&st.store, more[i - 2]);
    exe_store_release(&st.store, a1);
    exe_store_release(&st.store, a0);
    exe_store_release(&st.store, a0b);
    /* unpinned, the least recently used go when a new one needs the room */
    be_adapter *again;
    CHECK(exe_load_sampler_adapter(&st, dg[0], &again, err, sizeof err) == 0, "reload: %s", err);
    exe_store_release(&st.store, again);
    exe_store_stats ss;
    exe_store_get_stats(&st.store, &ss);
    CHECK(ss.count[STORE_CHECKPOINT] == 8 && ss.used <= ss.budget, "the cache shrank to its budget: %d adapters, %zu of %zu bytes",
          ss.count[STORE_CHECKPOINT], ss.used, ss.budget);
    char path[700];
    snprintf(path, sizeof path, "%s/sha256/%.2s/%s", bdir, dg[11], dg[11]);
    FILE *f = fopen(path, "r+b");
    if (f) { fseek(f, 100, SEEK_SET); fputc('Z', f); fclose(f); }
    be_adapter *x = NULL;
    /* dg[11] may still be cached (recently used); a never-loaded corrupted blob must fail */
    fill(&src, 9.0f);
    uint8_t *b;
    size_t n;
    char dz[BLOB_DIGEST_HEX];
    adapter_io_encode(&src, false, &b, &n, err, sizeof err);
    blob_put(st.blobs, b, n, dz, err, sizeof err);
    free(b);
    snprintf(path, sizeof path, "%s/sha256/%.2s/%s", bdir, dz, dz);
    if ((f = fopen(path, "r+b"))) { fseek(f, 200, SEEK_SET); fputc('Z', f); fclose(f); }
    CHECK(exe_load_sampler_adapter(&st, dz, &x, err, sizeof err) < 0 && strstr(err, "corrupted") && !x,
          "a corrupted blob is refused: %s", err);
    adapter_state_free(&src);
    exe_store_free(&st.store);
    st.be->destroy(st.ctx);
    blob_close(st.blobs);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) {}
}

int main(void) {
    if (sodium_init() < 0) return 2;
    test_roundtrip();
    test_sampler_loader();
    test_paths_tokens();
    return check_summary();
}
