/* mkmodel.h — writes random-initialised base models in HF layout (config.json +
 * model.safetensors) for tests and benchmarks: `loom mkmodel`.
 *
 * Every tensor is drawn from its own PRNG stream seeded by (seed, tensor name), so the
 * same seed gives bit-identical files, and changing e.g. the layer count leaves the other
 * tensors unchanged. Linear weights ~ N(0, init_std²); norm weights ~ 1 + N(0, norm_noise²)
 * (not exactly 1, so a test notices a missing or misplaced norm); biases ~ N(0, init_std²).
 */
#ifndef LOOM_MODEL_MKMODEL_H
#define LOOM_MODEL_MKMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char arch[16];        /* "llama" | "qwen2" | "qwen3" | "qwen3_moe" */
    const char *out_dir;  /* created if missing */
    int vocab, hidden, inter, layers, heads, kv_heads, head_dim, max_pos;
    bool tie;
    uint64_t seed;
    bool bf16;            /* store BF16 (else F32) */
    double init_std;      /* 0.02 */
    double norm_noise;    /* 0.1 */
    double rope_theta;
    double rms_eps;
    bool rope_llama3;     /* add a llama3 rope_scaling block (factor 8, original context max_pos/4) */
    int bos, eos;
    /* qwen3_moe only: experts, experts per token, an expert's MLP width; layer l is sparse
     * when (l + 1) % sparse_step == 0 and l is not in mlp_only (inter is the dense layers'
     * width); fused_experts writes transformers 5's fused tensors instead of one per expert */
    int experts, top_k, moe_inter, sparse_step;
    bool norm_topk;
    int mlp_only[64], n_mlp_only;
    bool fused_experts;
} mkmodel_opts;

/* Fill o with the defaults of arch ("llama", "qwen2", "qwen3", "qwen3_moe") and preset
 * ("tiny", "qwen3-0.6b", "qwen3-30b-a3b"; NULL = tiny). 0 ok, -1 with err. out_dir is
 * left NULL. */
int mkmodel_defaults(mkmodel_opts *o, const char *arch, const char *preset, char *err, size_t errlen);

/* Write o->out_dir/config.json, o->out_dir/model.safetensors and (when the vocabulary
 * is large enough) o->out_dir/tokenizer.json and tokenizer_config.json. 0 ok, -1 with err. */
int mkmodel_write(const mkmodel_opts *o, char *err, size_t errlen);

/* A byte-level BPE tokenizer.json for a generated model (mkmodel_tokenizer.c): byte
 * tokens, merges, the special tokens <|begin_of_text|> (bos) and <|endoftext|> (eos) at
 * the config's ids and the ChatML markers <|im_start|>, <|im_end|> at the last two ids,
 * all below vocab; and, when config_path is not NULL, a tokenizer_config.json there with
 * the ChatML chat template. arch "llama" or "qwen…" picks the split pattern.
 * 0 ok, 1 when vocab is too small (nothing written, err says why), -1 with err. */
int mkmodel_write_tokenizer(const char *path, const char *config_path, const char *arch, int vocab, int bos, int eos,
                            char *err, size_t errlen);

/* CLI: loom mkmodel --arch llama|qwen2|qwen3|qwen3_moe --out DIR
 *   [--preset tiny|qwen3-0.6b|qwen3-30b-a3b]
 *   [--layers N --hidden H --inter I --heads N --kv-heads N --head-dim D --vocab V
 *    --max-pos P --tie 0|1] [--seed S] [--dtype f32|bf16] [--init-std X] [--norm-noise X]
 *   [--rope-theta X] [--rope-scaling llama3]
 *   qwen3_moe: [--experts E --top-k K --moe-inter I --norm-topk 0|1 --sparse-step S
 *               --mlp-only L,L,... --fused-experts 0|1]
 * argv[0] is the command name (a leading "mkmodel" argument is skipped too). Returns the
 * process exit status. */
int mkmodel_main(int argc, char **argv);

#endif
