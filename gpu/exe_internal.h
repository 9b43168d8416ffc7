/* exe_internal.h: what the executor's loop (executor.c) shares with the files that
 * implement families of operations (exe_train.c; sampling and checkpoints next). An
 * operation handler reads op->payload (the api's normalised JSON) and sets either
 * op->result (the exact JSON the client receives) or an error via exe_op_fail. */
#pragma once
#include "gpu/backend.h"
#include "gpu/lora.h"
#include "gpu/model.h"
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct {
    char id[256];
    adapter *ad;
} model_slot;

typedef struct {
    const exe_backend *be;
    void *ctx;
    base_model *model;
    int vocab;
    model_slot *slots;
    int nslots, cap;
} exe_state;

typedef struct {
    int64_t id;
    char request_id[80];
    char model_id[256];
    char kind[32];
    json_t *payload;
    lora_config lcfg;
    /* outcome */
    json_t *result;
    char error[512];
    const char *category;   /* NULL = success */
} exe_op;

adapter *exe_slot_find(exe_state *st, const char *model_id);
void exe_slot_put(exe_state *st, const char *model_id, adapter *ad);
void exe_op_fail(exe_op *op, const char *category, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* exe_train.c */
void exe_run_create(exe_state *st, exe_op *op);
/* Packs every datum of ops into one batch (backward or forward only) and sets results. */
void exe_run_fb_batch(exe_state *st, exe_op **ops, int nops, bool backward);
void exe_run_optim(exe_state *st, exe_op *op);
