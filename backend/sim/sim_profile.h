/* sim_profile.h — what the sim backend (sim_backend.c) pretends to be: a modelled GPU
 * running a modelled base model, as the time each backend call would take there and the
 * device memory its adapters would hold. The sim computes next to nothing; these figures
 * decide how long it sleeps, so that a fleet of sim executors loads the queue (PostgreSQL,
 * the scheduler, the api) as a fleet of real GPUs would.
 *
 * Chosen by $LOOM_SIM_PROFILE (default "h100-qwen3-8b"); $LOOM_SIM_SCALE multiplies every
 * time (default 1; 0: no waiting at all, the queue's own ceiling; 2: a GPU half as fast).
 * defines: sim_profile, sim_profile_find, sim_profile_names, sim_fb_s, sim_decode_step_s,
 *          sim_lora_params, sim_optim_s, sim_host_copy_s, sim_device_copy_s */
#ifndef LOOM_BACKEND_SIM_PROFILE_H
#define LOOM_BACKEND_SIM_PROFILE_H

#include <stdbool.h>
#include <stddef.h>

#include "model/lora.h"

typedef struct {
    const char *name;             /* $LOOM_SIM_PROFILE */
    const char *gpu, *model;      /* for the executor's device description */
    /* time */
    double pass_s;                /* fixed cost of one packed pass (launches, the head) */
    double fb_s_per_token;        /* forward + backward of one token (LoRA: no base-weight gradients) */
    double fwd_s_per_token;       /* forward only (a `forward` op, a sampling prompt's prefill) */
    double decode_step_s;         /* one decode step: the weights read once, whatever the batch */
    double decode_s_per_sample;   /* ... and per live sample (its KV cache, its head row) */
    double hbm_bytes_per_s;       /* device memory bandwidth as reached (AdamW, adapter copies) */
    double host_bytes_per_s;      /* host <-> device (adapter uploads and downloads) */
    /* memory */
    double memory_bytes;          /* device memory */
    double weights_bytes;         /* the base weights on it */
    /* the modelled base model's geometry: the size of its adapters */
    int layers, hidden, q_dim, kv_dim, inter, vocab;
} sim_profile;

/* The profile named (NULL: unknown). */
const sim_profile *sim_profile_find(const char *name);
/* "h100-qwen3-8b, ..." for messages. */
const char *sim_profile_names(void);

/* Seconds of one packed forward(_backward) pass over `tokens` tokens. */
double sim_fb_s(const sim_profile *p, long tokens, bool backward);
/* Seconds of one decode step with `live` samples. */
double sim_decode_step_s(const sim_profile *p, int live);
/* Parameters of an adapter of config c on the modelled base model (not the model the
 * executor opened, whose small layout the sim's adapters actually have). */
double sim_lora_params(const sim_profile *p, const lora_config *c);
/* Seconds of one AdamW step on an adapter of n modelled parameters. */
double sim_optim_s(const sim_profile *p, double n);
/* Seconds to move `bytes` between host and device / within the device. */
double sim_host_copy_s(const sim_profile *p, double bytes);
double sim_device_copy_s(const sim_profile *p, double bytes);

#endif
