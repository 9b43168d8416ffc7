/* adapter_io.h: a LoRA adapter (its host form, adapter_state of model/lora.h) as
 * safetensors bytes and back, and the files of a checkpoint archive (docs/protocol.md §17) made from
 * those bytes.
 *
 * The registry blob of a checkpoint is ONE safetensors file:
 *   - every adapter tensor under its PEFT key (lora_layout order), F32, [rows, cols];
 *   - training state only: for every key K, "K.exp_avg" and "K.exp_avg_sq" (Adam m, v);
 *   - "__metadata__": format=pt, loom.kind=training|sampler, loom.step, loom.lora_rank,
 *     loom.lora_alpha, loom.train_attn/mlp/unembed, loom.num_layers/hidden/vocab, and for a
 *     mixture-of-experts model loom.num_experts.
 * The bytes depend on the adapter state only (no names, no times), so the same state
 * always gives the same sha256 and the blob store deduplicates it.
 *
 * Reading never trusts the bytes: every expected tensor must be present with its exact
 * shape, and no tensor of an untrained module may be there; errors name the tensor. */
#pragma once
#include "model/lora.h"
#include "model/model.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a blob says about itself (its __metadata__ and tensors). */
typedef struct {
    lora_config cfg;          /* rank and module flags (seed 0) */
    bool has_optimizer;       /* training state: exp_avg / exp_avg_sq present */
    int64_t step;             /* optimizer steps taken */
    int num_layers, hidden, vocab;
    int num_experts;          /* loom.num_experts (MoE models; absent: 0) */
    double lora_alpha;
} adapter_io_info;

/* Serialises a's parameters (and its Adam state and step when with_optimizer) into a
 * malloc'd buffer. 0, or -1 with err. */
int adapter_io_encode(const adapter_state *a, bool with_optimizer, uint8_t **out, size_t *outlen, char *err,
                      size_t errlen);

/* Reads the header of a blob. 0, or -1 with err (not safetensors, not a Loom adapter). */
int adapter_io_info_read(const void *buf, size_t len, adapter_io_info *info, char *err, size_t errlen);

/* Restores a's parameters from buf; with optimizer also Adam m, v and the step (the blob
 * must be a training checkpoint, a must hold m and v), else step = 0 and m, v (where a
 * holds them) zero. Gradients a holds are zeroed. The blob must match a's layout
 * exactly (rank, modules, shapes); a is untouched on error. */
int adapter_io_restore(adapter_state *a, const void *buf, size_t len, bool optimizer, char *err, size_t errlen);

/* The blob's weights as a new state (parameters only) for base model mc. 0 or -1 + err. */
int adapter_io_decode(const model_config *mc, const void *buf, size_t len, adapter_state *out, char *err,
                      size_t errlen);

/* ---- archive files (docs/protocol.md §17) ----------------------------------------- */

typedef enum { ADAPTER_EXPORT_TINKER, ADAPTER_EXPORT_PEFT } adapter_export_format;

typedef struct {
    const char *name;   /* archive member name */
    uint8_t *data;      /* malloc'd */
    size_t len;
} adapter_export_file;

typedef struct {
    adapter_export_file files[5];
    int n;
} adapter_export;

/* The archive members of a checkpoint blob, in archive order: adapter_config.json,
 * adapter_model.safetensors, checkpoint_complete, and for training state
 * optimizer.safetensors + optimizer.json. PEFT format renames the head to lm_head and
 * lists target_modules (§17.6); with_head false leaves the head out (&unembed=0).
 * 0, or -1 with err. */
int adapter_io_export(const void *blob, size_t len, adapter_export_format fmt, const char *base_model_name,
                      bool with_head, adapter_export *out, char *err, size_t errlen);
void adapter_export_free(adapter_export *e);

/* What an import takes at most (`loom adapter import`, an HTTP upload, docs/protocol.md §12.5). */
#define ADAPTER_IMPORT_MAX_CONFIG (1u << 20)           /* adapter_config.json */
#define ADAPTER_IMPORT_MAX_WEIGHTS (16ull << 30)       /* adapter_model.safetensors */

/* Builds a sampler blob from a PEFT or Tinker adapter (adapter_config.json text +
 * adapter_model.safetensors bytes) for base model geometry mc: keys lm_head and
 * unembed_tokens both map to the head, modules present decide the flags, and a
 * lora_alpha other than 32 is folded into B so that ΔW stays the same. 0 or -1 + err. */
int adapter_io_import(const model_config *mc, const char *config_json, const void *st_bytes, size_t st_len,
                      uint8_t **out, size_t *outlen, adapter_io_info *info, char *err, size_t errlen);
