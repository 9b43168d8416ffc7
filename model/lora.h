/* lora.h — LoRA adapters as data: their layout (which tensors, PEFT names, shapes) and
 * their host form (adapter_state: the numbers, for files, checkpoints and transfers to
 * and from a backend). Where an adapter lives while it trains is the backend's business
 * (backend/backend.h: be_adapter); this is what every backend and file format agrees on.
 *
 * Conventions (docs/protocol.md §17.2/§17.4, PEFT): for an adapted nn.Linear with weight W [out, in],
 *   y = x Wᵀ + scale · (x Aᵀ) Bᵀ,   A [r, in], B [out, r],   scale = alpha / r, alpha = 32.
 * A starts as PEFT's kaiming_uniform(a=√5), i.e. U(−1/√in, 1/√in), from a stream seeded by
 * (lora seed, tensor name); B starts at zero, so a fresh adapter leaves the model unchanged.
 * Modules: train_attn → q,k,v,o; train_mlp → gate,up,down; train_unembed → the output head
 * ("model.unembed_tokens"; with tied embeddings it adapts the head only, not the input).
 * In a sparse (mixture-of-experts) layer train_mlp adapts every expert's gate, up and down,
 * each expert with its own A and B ("model.layers.L.mlp.experts.E.gate_proj", the PEFT
 * names of transformers' per-expert modules); the router (mlp.gate) is not adapted.
 *
 * Memory (llm.c style): every part (params, grads, Adam m, Adam v) is ONE flat array of
 * num_params floats, carved into the tensors in layout order at the tensors' offsets. A
 * backend keeps the same order on its device, so a transfer is one copy per part.
 */
#ifndef LOOM_MODEL_LORA_H
#define LOOM_MODEL_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "contract/contract.h"
#include "model/model.h"

#define LORA_ALPHA 32.0f

typedef struct {
    int rank;
    uint64_t seed;
    bool train_attn, train_mlp, train_unembed;
} lora_config;

typedef enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_NUM_MODULES } lora_module;

/* One tensor of an adapter. A and B of one adapted linear are consecutive (A first). */
typedef struct {
    const char *name;   /* PEFT key, e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight */
    int layer;          /* -1: the output head */
    lora_module module; /* unused for the head */
    int expert;         /* the expert of a sparse layer's gate/up/down; -1 elsewhere */
    bool is_b;          /* lora_B (else lora_A) */
    int rows, cols;     /* A [r, in], B [out, r] */
    size_t offset;      /* into each part's flat array */
} lora_tensor;

/* Which tensors an adapter of config cfg has on a base model, in a fixed order: layer by
 * layer q,k,v,o, then gate,up,down (a sparse layer: expert 0's gate,up,down, expert 1's,
 * ...), lora_A then lora_B each, then the head. */
typedef struct {
    lora_config cfg;
    float scale;                     /* LORA_ALPHA / rank */
    int num_layers, hidden, vocab;   /* geometry of the base model it was made for */
    int num_experts;                 /* of its sparse layers (0: a dense model) */
    int num_tensors;
    lora_tensor *tensors;
    size_t num_params;               /* floats per part */
    char *names;                     /* storage of the tensor names */
    size_t names_len;                /* its bytes */
} lora_layout;

/* The layout of an adapter of config c on model mc (rank 1..LIMIT_LORA_RANK). 0 or -1 + err. */
int lora_layout_init(lora_layout *l, const model_config *mc, const lora_config *c, char *err, size_t errlen);
int lora_layout_copy(lora_layout *dst, const lora_layout *src, char *err, size_t errlen);
/* The num_params of that layout, counted without building it (get_info, weights_info). */
size_t lora_count_params(const model_config *mc, const lora_config *c);
/* What a trainable adapter of n parameters holds: fp32 weights, gradients and the two
 * AdamW moments (the CUDA backend adds a bf16 copy of the weights, 2 bytes each). */
#define LORA_TRAINABLE_BYTES(n) ((size_t)(n) * 4 * sizeof(float))
void lora_layout_free(lora_layout *l);
int lora_find_tensor(const lora_layout *l, const char *name); /* index or -1 */
/* True when both describe the same tensors (same config apart from the seed, same geometry). */
bool lora_layout_same(const lora_layout *a, const lora_layout *b);

/* The parts of an adapter, as a bit set (transfers name the parts they move). */
enum {
    ADAPTER_PARAMS = 1,     /* the A and B weights */
    ADAPTER_GRADS = 2,      /* gradient accumulators */
    ADAPTER_OPTIM = 4,      /* AdamW first and second moments, and the step count */
};

/* An adapter's numbers on the host: what checkpoints are made of, and what a backend
 * uploads from and downloads into. A NULL part is absent (in an upload: zeros). */
typedef struct {
    lora_layout layout;
    int64_t step;                  /* optimizer steps taken (ADAPTER_OPTIM) */
    float *params, *grads, *m, *v; /* num_params each, or NULL */
} adapter_state;

/* An adapter_state with layout l (copied) and zeroed arrays for the given parts. */
int adapter_state_alloc(adapter_state *s, const lora_layout *l, unsigned parts, char *err, size_t errlen);
void adapter_state_free(adapter_state *s);
/* Fills s->params with PEFT's initial values (A from the seeded stream, B zero). */
void adapter_state_init_peft(adapter_state *s);

#endif
