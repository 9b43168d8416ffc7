/* sim_profile.c — the modelled GPUs and base models of the sim backend (see sim_profile.h).
 *
 * h100-qwen3-8b: an NVIDIA H100 SXM5 80GB training LoRA adapters on Qwen3-8B in bf16.
 *   The model (Qwen/Qwen3-8B config.json on Hugging Face): 36 layers, hidden 4096, 32 query
 *   heads and 8 key/value heads of 128 (q 4096, kv 1024), MLP 12288, vocabulary 151936,
 *   untied head; 8.2e9 parameters, 16.4 GB in bf16.
 *   The GPU (NVIDIA's H100 datasheet): 989 TFLOP/s dense bf16, 3.35 TB/s HBM3, 80 GiB,
 *   PCIe Gen5 x16.
 *   forward+backward: the anchor is Loom's issue 25, "a Qwen3-8B step of 2x2048 tokens
 *     should take ~250 ms". It agrees with the hardware: a LoRA step costs about 4N
 *     FLOPs per token (2N forward, 2N for the activations' gradients; the frozen weights
 *     get none), 4 x 8.2e9 x 4096 = 1.34e14 FLOPs, 136 ms at peak, so 250 ms is 54 % of
 *     peak (attention at 2048 tokens adds ~10 %). 250 ms = 2 ms per pass + 4096 x 60.5 us.
 *   forward only (a `forward` op, prefill): 2N of the 4N FLOPs, half: 30.3 us per token.
 *   decode: the anchor is the "a decode step of 32 samples ~8 ms". Reading the
 *     16.4 GB of weights once per step at ~80 % of 3.35 TB/s takes 6 ms whatever the
 *     batch; the other 2 ms over 32 samples (their KV caches and head rows) is 62.5 us
 *     per live sample.
 *   AdamW on an adapter reads p, g, m, v and writes p, m, v (28 bytes per fp32 parameter)
 *   at 80 % of HBM (2.7e12 B/s); adapter copies on the device likewise; uploads and
 *   downloads at 25 GB/s (pageable host memory over PCIe Gen5 x16, about half its 64 GB/s).
 *
 * A new profile: a row below, its figures' sources in this comment. */
#include "backend/sim/sim_profile.h"

#include <stdio.h>
#include <string.h>

static const sim_profile PROFILES[] = {
    {.name = "h100-qwen3-8b", .gpu = "H100 SXM5 80GB", .model = "Qwen3-8B",
     .pass_s = 2e-3, .fb_s_per_token = 60.5e-6, .fwd_s_per_token = 30.3e-6,
     .decode_step_s = 6e-3, .decode_s_per_sample = 62.5e-6,
     .hbm_bytes_per_s = 2.7e12, .host_bytes_per_s = 25e9,
     .memory_bytes = 80.0 * 1073741824.0, .weights_bytes = 16.4e9,
     .layers = 36, .hidden = 4096, .q_dim = 4096, .kv_dim = 1024, .inter = 12288, .vocab = 151936},
};
enum { N_PROFILES = sizeof PROFILES / sizeof PROFILES[0] };

const sim_profile *sim_profile_find(const char *name)
{
    for (int i = 0; i < N_PROFILES; i++)
        if (!strcmp(PROFILES[i].name, name)) return &PROFILES[i];
    return NULL;
}

const char *sim_profile_names(void)
{
    static char names[256];
    size_t n = 0;
    names[0] = 0;
    for (int i = 0; i < N_PROFILES && n < sizeof names; i++)
        n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", PROFILES[i].name);
    return names;
}

double sim_fb_s(const sim_profile *p, long tokens, bool backward)
{
    if (tokens <= 0) return 0;
    return p->pass_s + (double)tokens * (backward ? p->fb_s_per_token : p->fwd_s_per_token);
}

double sim_decode_step_s(const sim_profile *p, int live)
{
    return live > 0 ? p->decode_step_s + live * p->decode_s_per_sample : 0;
}

/* A [r, in] + B [out, r] per adapted linear: r (in + out) parameters (model/lora.h). */
double sim_lora_params(const sim_profile *p, const lora_config *c)
{
    double per_layer = 0, H = p->hidden;
    if (c->train_attn) per_layer += (H + p->q_dim) + 2 * (H + p->kv_dim) + (p->q_dim + H);
    if (c->train_mlp) per_layer += 3 * (H + p->inter);
    double head = c->train_unembed ? H + p->vocab : 0;
    return c->rank * (p->layers * per_layer + head);
}

double sim_optim_s(const sim_profile *p, double n) { return 20e-6 + 28 * n / p->hbm_bytes_per_s; }

double sim_host_copy_s(const sim_profile *p, double bytes) { return bytes / p->host_bytes_per_s; }

double sim_device_copy_s(const sim_profile *p, double bytes) { return 2 * bytes / p->hbm_bytes_per_s; }
