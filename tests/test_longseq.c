/* test_longseq.c: an 8192-token sequence through a backend's forward_backward
 * (LOOM_TEST_BACKEND, default cpu)
 * (issue 4: long sequences without a T×T attention matrix per head in memory).
 * With 4 heads, a materialised T×T fp32 score matrix per head would need 1 GiB; the
 * process's peak resident memory must stay far below that. The first positions'
 * logprobs must equal those of a separate short run (causal attention: a prefix does
 * not see what follows), and gradients must be finite. */
#include "backend/backend.h"
#include "model/lora.h"
#include "model/mkmodel.h"
#include "model/model.h"
#include "tests/lib/test_backend.h"
#include "check.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static long peak_rss_mb(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss / 1024;
}

int main(void) {
    enum { T = 8192, SHORT = 256 };
    char dir[] = "/tmp/loom-long-XXXXXX", err[512];
    if (!mkdtemp(dir)) return 2;
    mkmodel_opts o;
    if (mkmodel_defaults(&o, "llama", "tiny", err, sizeof err) != 0) { printf("%s\n", err); return 2; }
    o.out_dir = dir;
    o.max_pos = 16384;
    if (mkmodel_write(&o, err, sizeof err) != 0) { printf("mkmodel: %s\n", err); return 2; }
    lora_config lc = {.rank = 8, .seed = 3, .train_attn = true, .train_mlp = true, .train_unembed = true};
    const be_backend *be = test_backend();
    void *ctx = test_backend_open(be, dir, 2, NULL, err, sizeof err);
    be_adapter *ad = ctx ? be_adapter_new(be, ctx, &lc, true, err, sizeof err) : NULL;
    if (!ad || !ctx) { printf("setup: %s\n", err); return 2; }
    /* Nonzero B so every LoRA gradient is exercised. */
    adapter_state h = test_download(be, ctx, ad, ADAPTER_PARAMS);
    for (int i = 0; i < h.layout.num_tensors; i++) {
        const lora_tensor *t = &h.layout.tensors[i];
        if (t->is_b) for (int k = 0; k < t->rows * t->cols; k++) h.params[t->offset + k] = 0.01f * (float)((k * 7919) % 13 - 6);
    }
    test_upload(be, ctx, ad, &h, ADAPTER_PARAMS);
    adapter_state_free(&h);
    bool device = strcmp(be->name, "cpu") != 0;
    be_device_info dev0, dev1;
    be->device_info(ctx, &dev0);
    int32_t *tok = malloc(T * sizeof *tok), *tgt = malloc(T * sizeof *tgt);
    for (int i = 0; i < T; i++) { tok[i] = (i * 31 + 7) % 251; tgt[i] = (i * 31 + 38) % 251; }
    float *lp = calloc(T, sizeof *lp), *loss = calloc(T, sizeof *loss);
    float *lp_short = calloc(SHORT, sizeof *lp_short), *loss_short = calloc(SHORT, sizeof *loss_short);
    be_seq s = {.ad = ad, .loss = {.kind = LOSS_CROSS_ENTROPY}, .n = T, .tokens = tok, .targets = tgt,
                 .logprobs_out = lp, .loss_out = loss};
    /* A device backend's first pass of a length loads its libraries' kernels and builds its
     * plans (cuDNN's: ~250 MiB of host memory, once): the host bar holds for the pass after
     * (whose gradients add to the first's: only their finiteness is checked). */
    int rc = device ? be->forward_backward(ctx, &s, 1, true, err, sizeof err) : 0;
    long rss_before = peak_rss_mb();
    if (rc == 0) rc = be->forward_backward(ctx, &s, 1, true, err, sizeof err);
    CHECK(rc == 0, "forward_backward on %d tokens: %s", T, rc ? err : "ok");
    long rss = peak_rss_mb();
    CHECK(rss - rss_before < 200, "peak memory grew by %ld MiB (one T x T fp32 score matrix alone is 256 MiB, one per head 1024 MiB)",
          rss - rss_before);
    /* a device backend's workspace stays on its device: the same bar there, beside the
     * attention's own workspace, which the backend reports and bounds (cuDNN's deterministic
     * backward keeps dP, T x T per head of a head group, within a quarter of the device; the
     * own kernels keep none). The CPU backend's "device" is the machine, whose free memory
     * other processes move. */
    be->device_info(ctx, &dev1);
    long dev_mb = ((long)dev0.memory_free - (long)dev1.memory_free) >> 20, ws_mb = (long)(dev1.attn_workspace >> 20);
    if (device) {
        CHECK(dev_mb - ws_mb < 200, "device memory in use grew by %ld MiB on %s, %ld MiB of it the attention's workspace",
              dev_mb, dev1.device, ws_mb);
        CHECK(dev1.attn_workspace <= dev1.memory_total / 2, "the attention's workspace (%ld MiB) within half the device",
              ws_mb);
    }
    bool finite = true;
    for (int i = 0; i < T; i++) finite &= isfinite(lp[i]) && lp[i] <= 0;
    adapter_state g = test_download(be, ctx, ad, ADAPTER_GRADS);
    for (size_t k = 0; k < g.layout.num_params; k++) finite &= isfinite(g.grads[k]);
    adapter_state_free(&g);
    CHECK(finite, "all logprobs and LoRA gradients finite");
    be_seq s2 = {.ad = ad, .loss = {.kind = LOSS_CROSS_ENTROPY}, .n = SHORT, .tokens = tok, .targets = tgt,
                  .logprobs_out = lp_short, .loss_out = loss_short};
    rc = be->forward_backward(ctx, &s2, 1, false, err, sizeof err);
    double worst = 0;
    for (int i = 0; i < SHORT; i++) worst = fmax(worst, fabs(lp[i] - lp_short[i]));
    /* fp32 (cpu): 1e-4; bf16 backends: the two runs' GEMMs over 8192 and 256 rows may round
     * differently: 2e-2 */
    double bar = test_backend_bf16(be) ? 2e-2 : 1e-4;
    CHECK(rc == 0 && worst < bar, "the first %d logprobs equal a separate %d-token run (worst diff %.2e)", SHORT,
          SHORT, worst);
    be->adapter_free(ctx, ad);
    be->destroy(ctx);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) {}
    return check_summary();
}
