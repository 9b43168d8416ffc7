/* lcu_cudnn_attn.c — causal GQA self-attention over packed variable-length sequences
 * through cuDNN 9's fused flash attention, forward and deterministic backward (cuda_ops.h,
 * "attention through cuDNN"), with execution plans cached per shape bucket.
 *
 * Which cuDNN API: the "fused attention operation graph" of cuDNN's backend API, the graph
 * cuDNN's own frontend builds for sdpa()/sdpa_backward() on Hopper (its CompositeSDPANode
 * and CompositeSDPABackwardNode): matmuls, pointwise ops and reductions that cuDNN's
 * engines recognise as one flash-attention kernel. cuDNN 9.13+ also has single SDPA
 * operation descriptors (CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD_DESCRIPTOR), but in the
 * headers this builds with (9.19) the forward one has no causal mask (the frontend adds
 * masks to it through a subgraph attribute from 9.21 on), no ragged tensors are listed for
 * it before 9.23, the frontend never builds the backward one, and it picks the graph below
 * for these features itself. The graphs follow the frontend's node for node and type for
 * type (the engines match patterns, so the shape of the graph matters):
 *
 *   forward   S = (Q·Kᵀ)·scale; padding mask (row < len_q, col < len_kv); causal mask
 *             (row ≥ col); M = max S; E = exp(S − M); Z = Σ E; Stats = M + log Z;
 *             O = (E / Z as bf16)·V.
 *   backward  (the frontend's deterministic form for Hopper: dQ straight from its matmul,
 *             no fp32 atomics) Δ = Σ dO⊙O; P = exp(mask(S) − Stats); dV = Pᵀ·dO (summed
 *             over the heads of a group); dS = P⊙(dO·Vᵀ − Δ)·scale; dK = dSᵀ·Q (summed);
 *             dQ = dS·K. Engines with cuDNN's NONDETERMINISTIC note are never chosen.
 *
 * Layouts: the kernel layer's packed rows are cuDNN's "THD" form: Q as [B, nq, S, d] with
 * strides [—, d, nq·d, 1] and a ragged offset per sequence (q_start[i]·nq·d elements), the
 * same for K, V (nkv heads), O, dO, dQ, dK, dV; Stats [B, nq, S, 1] strides [—, 1, nq, 1]
 * is exactly lse [rows, nq]. B and S are a bucket (sequences up to a power of two with
 * empty sequences after the last, S from 64·{1, 1.5}·2^k rows up): the per-sequence
 * lengths and offsets are device tensors computed from q_start on the stream
 * (lcd_ragged_prep), so one plan serves every batch of its bucket.
 */
#include "backend/cuda/lcu_cudnn.h"
#include "common/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LOOM_HAVE_CUDNN_H

#include <dlfcn.h>
#include <float.h>
#include <math.h>

/* uids of the tensors the caller's pointers (or host scalars) bind to */
enum {
    U_Q = 1, U_K, U_V, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV, U_SSUM, U_SEQ_Q, U_SEQ_KV, U_RO_QO, U_RO_KV, U_RO_ST,
    U_SCALE, U_ONE, U_NEGINF_PAD, U_NEGINF_CAUSAL, U_NEGINF_PAD2
};

#define LCA_CAP 32 /* plans kept; the least recently used goes first */

typedef struct {
    bool used, bwd, refused, pad2;
    int B, S, nq, nkv, d;
    int rq, rkv;       /* heads in a row of the caller's tensors: nq, nkv but for a backward in
                          head groups (lca_bwd_plan), where the graph takes nq/nkv of them */
    lcd_graph g;
    uint64_t last_use;
    int accepted;      /* of a refused bucket: lcd_graph.accepted, workspace, engine before the */
    int64_t workspace; /* graph went */
    int64_t engine;
} lca_plan;

struct lcu_cudnn {
    const lcd_api *api;
    cudnnHandle_t h;                /* NULL in a device-less context */
    cudnnBackendDescriptor_t devprop; /* the device a device-less context plans for */
    lca_plan plans[LCA_CAP];
    uint64_t tick;
    void *ws;       /* device workspace: lengths, offsets, Δ, bf16 gradients, cuDNN's own */
    size_t ws_cap;
    size_t ws_refused; /* the last size cudaMalloc refused (said once) */
    int64_t ws_max; /* a plan asking more of its own is refused (LCU_CUDNN_WORKSPACE_MB) */
    bool exact_b;   /* LCU_CUDNN_EXACT_BATCH: no padding sequences (B = the batch's count) */
    bool any_engine; /* LCU_CUDNN_ANY_ENGINE: the backward may take engines noted NONDETERMINISTIC */
    bool verbose;   /* LCU_CUDNN_VERBOSE: a line per plan built */
    float neg_inf;  /* the mask value: −inf, or −FLT_MAX before 9.10 (as the frontend) */
    char desc[600];
};

static int lca_bucket_b(int nseq)
{
    int b = 1;
    while (b < nseq) b <<= 1;
    return b;
}

/* 64, 128, 192, 256, 384, 512, 768, ...: multiples of 64 (the engines' tiles), at most a
 * third of the rows padding past 128 */
static int lca_bucket_s(long n)
{
    if (n <= 64) return 64;
    long s = 128;
    for (;;) {
        if (n <= s) return (int)s;
        if (n <= s + s / 2) return (int)(s + s / 2);
        s <<= 1;
    }
}

/* ---- the graphs ------------------------------------------------------------------------- */

#define DIM(a, b, c, d) ((const int64_t[4]){(a), (b), (c), (d)})

/* mask keeping (row < len_q) ∧ (col < len_kv): the rows and keys of each packed sequence */
static lcd_t lca_padding(lcd_graph *g, lcd_t s, const int64_t *dim, const int64_t *str, lcd_t len_q, lcd_t len_kv,
                         int64_t ninf_uid)
{
    lcd_t row = lcd_virtual(g, CUDNN_DATA_INT32, dim, str), col = lcd_virtual(g, CUDNN_DATA_INT32, dim, str);
    lcd_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, NULL, NULL, row, 2);
    lcd_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, NULL, NULL, col, 3);
    lcd_t rm = lcd_virtual(g, CUDNN_DATA_BOOLEAN, dim, str), cm = lcd_virtual(g, CUDNN_DATA_BOOLEAN, dim, str);
    lcd_pointwise(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, row, len_q, NULL, rm, -1);
    lcd_pointwise(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, col, len_kv, NULL, cm, -1);
    lcd_t m = lcd_virtual(g, CUDNN_DATA_BOOLEAN, dim, str);
    lcd_pointwise(g, CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, rm, cm, NULL, m, -1);
    lcd_t y = lcd_virtual(g, CUDNN_DATA_FLOAT, dim, str);
    /* binary select: y = m ? s : −inf */
    lcd_pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, lcd_scalar(g, ninf_uid, CUDNN_DATA_FLOAT), m, y,
                  -1);
    return y;
}

/* mask keeping row ≥ col: causal, the diagonal at the top left (self-attention: q_len = kv_len) */
static lcd_t lca_causal(lcd_graph *g, lcd_t s, const int64_t *dim, const int64_t *str, int64_t ninf_uid)
{
    lcd_t row = lcd_virtual(g, CUDNN_DATA_INT32, dim, str), col = lcd_virtual(g, CUDNN_DATA_INT32, dim, str);
    lcd_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, row, 2);
    lcd_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, col, 3);
    lcd_t c = lcd_virtual(g, CUDNN_DATA_BOOLEAN, dim, str);
    lcd_pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, c, -1);
    lcd_t y = lcd_virtual(g, CUDNN_DATA_FLOAT, dim, str);
    lcd_pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, lcd_scalar(g, ninf_uid, CUDNN_DATA_FLOAT), c, y,
                  -1);
    return y;
}

/* The tensors both graphs bind: lengths, ragged offsets, Q (and K, V in the forward's or
 * the backward's orientation), O, Stats. */
typedef struct {
    lcd_t len_q, len_kv, ro_qo, ro_kv, ro_st, q, k, v, o, stats, scale;
} lca_io;

static void lca_io_tensors(lcd_graph *g, const lca_plan *p, bool kv_transposed_v, lca_io *t)
{
    /* H, G heads of rows of RH, RG heads (a head group: the rest of the row is other calls') */
    int64_t B = p->B, S = p->S, H = p->nq, G = p->nkv, D = p->d, RH = p->rq, RG = p->rkv;
    t->len_q = lcd_tensor(g, U_SEQ_Q, CUDNN_DATA_INT32, DIM(B, 1, 1, 1), DIM(1, 1, 1, 1), 0, NULL);
    t->len_kv = lcd_tensor(g, U_SEQ_KV, CUDNN_DATA_INT32, DIM(B, 1, 1, 1), DIM(1, 1, 1, 1), 0, NULL);
    t->ro_qo = lcd_tensor(g, U_RO_QO, CUDNN_DATA_INT64, DIM(B + 1, 1, 1, 1), DIM(1, 1, 1, 1), 0, NULL);
    t->ro_kv = lcd_tensor(g, U_RO_KV, CUDNN_DATA_INT64, DIM(B + 1, 1, 1, 1), DIM(1, 1, 1, 1), 0, NULL);
    t->ro_st = lcd_tensor(g, U_RO_ST, CUDNN_DATA_INT64, DIM(B + 1, 1, 1, 1), DIM(1, 1, 1, 1), 0, NULL);
    t->q = lcd_tensor(g, U_Q, CUDNN_DATA_BFLOAT16, DIM(B, H, S, D), DIM(S * RH * D, D, RH * D, 1), 0, t->ro_qo);
    /* Kᵀ: [B, nkv, d, S] over the same memory (the graph multiplies Q by it) */
    t->k = lcd_tensor(g, U_K, CUDNN_DATA_BFLOAT16, DIM(B, G, D, S), DIM(S * RG * D, D, 1, RG * D), 0, t->ro_kv);
    if (kv_transposed_v) /* the backward multiplies dO by Vᵀ */
        t->v = lcd_tensor(g, U_V, CUDNN_DATA_BFLOAT16, DIM(B, G, D, S), DIM(S * RG * D, D, 1, RG * D), 0, t->ro_kv);
    else
        t->v = lcd_tensor(g, U_V, CUDNN_DATA_BFLOAT16, DIM(B, G, S, D), DIM(S * RG * D, D, RG * D, 1), 0, t->ro_kv);
    t->o = lcd_tensor(g, U_O, CUDNN_DATA_BFLOAT16, DIM(B, H, S, D), DIM(S * RH * D, D, RH * D, 1), 0, t->ro_qo);
    t->stats = lcd_tensor(g, U_STATS, CUDNN_DATA_FLOAT, DIM(B, H, S, 1), DIM(S * RH, 1, RH, 1), 0, t->ro_st);
    t->scale = lcd_scalar(g, U_SCALE, CUDNN_DATA_FLOAT);
}

static void lca_graph_fwd(lcd_graph *g, const lca_plan *p)
{
    int64_t B = p->B, S = p->S, H = p->nq;
    lca_io t;
    lca_io_tensors(g, p, false, &t);
    const int64_t *sd = DIM(B, H, S, S), *ss = DIM(H * S * S, S * S, S, 1); /* scores */
    const int64_t *rd = DIM(B, H, S, 1), *rs = DIM(H * S, S, 1, 1);         /* per-row values */
    lcd_t s1 = lcd_virtual(g, CUDNN_DATA_FLOAT, sd, ss), s2 = lcd_virtual(g, CUDNN_DATA_FLOAT, sd, ss);
    lcd_matmul(g, t.q, t.k, s1, t.len_q, t.len_kv, NULL);
    lcd_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s1, t.scale, NULL, s2, -1);
    lcd_t s3 = lca_padding(g, s2, sd, ss, t.len_q, t.len_kv, U_NEGINF_PAD);
    lcd_t s4 = lca_causal(g, s3, sd, ss, U_NEGINF_CAUSAL);
    /* softmax, with its statistics written out */
    lcd_t mx = lcd_virtual(g, CUDNN_DATA_FLOAT, rd, rs), z = lcd_virtual(g, CUDNN_DATA_FLOAT, sd, ss);
    lcd_t e = lcd_virtual(g, CUDNN_DATA_FLOAT, sd, ss), sum = lcd_virtual(g, CUDNN_DATA_FLOAT, rd, rs);
    lcd_t lg = lcd_virtual(g, CUDNN_DATA_FLOAT, rd, rs), pr = lcd_virtual(g, CUDNN_DATA_BFLOAT16, sd, ss);
    lcd_reduction(g, CUDNN_REDUCE_TENSOR_MAX, s4, mx);
    lcd_pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s4, mx, NULL, z, -1);
    lcd_pointwise(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, z, NULL, NULL, e, -1);
    lcd_reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    lcd_pointwise(g, CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, NULL, NULL, lg, -1);
    lcd_pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, mx, lg, NULL, t.stats, -1);
    lcd_pointwise(g, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, sum, NULL, pr, -1);
    lcd_matmul(g, pr, t.v, t.o, t.len_q, NULL, t.len_kv);
}

static void lca_graph_bwd(lcd_graph *g, lca_plan *p)
{
    int64_t B = p->B, S = p->S, H = p->nq, G = p->nkv, D = p->d, RH = p->rq, RG = p->rkv;
    lca_io t;
    lca_io_tensors(g, p, true, &t);
    lcd_t dO = lcd_tensor(g, U_DO, CUDNN_DATA_BFLOAT16, DIM(B, H, S, D), DIM(S * RH * D, D, RH * D, 1), 0, t.ro_qo);
    lcd_t dQ = lcd_tensor(g, U_DQ, CUDNN_DATA_BFLOAT16, DIM(B, H, S, D), DIM(S * RH * D, D, RH * D, 1), 0, t.ro_qo);
    lcd_t dK = lcd_tensor(g, U_DK, CUDNN_DATA_BFLOAT16, DIM(B, G, S, D), DIM(S * RG * D, D, RG * D, 1), 0, t.ro_kv);
    lcd_t dV = lcd_tensor(g, U_DV, CUDNN_DATA_BFLOAT16, DIM(B, G, S, D), DIM(S * RG * D, D, RG * D, 1), 0, t.ro_kv);
    /* Δ = Σ_c dO⊙O per row and head, kept in the workspace in the layout of Stats */
    lcd_t ssum = lcd_tensor(g, U_SSUM, CUDNN_DATA_FLOAT, DIM(B, H, S, 1), DIM(S * RH, 1, RH, 1), 0, t.ro_st);
    lcd_t one = lcd_scalar(g, U_ONE, CUDNN_DATA_FLOAT);
    lcd_t t1 = lcd_virtual(g, CUDNN_DATA_FLOAT, DIM(B, H, S, D), DIM(H * S * D, S * D, H * D, 1));
    lcd_t t2 = lcd_virtual(g, CUDNN_DATA_FLOAT, DIM(B, H, S, 1), DIM(H * S, S, 1, 1));
    lcd_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dO, t.o, NULL, t1, -1);
    lcd_reduction(g, CUDNN_REDUCE_TENSOR_ADD, t1, t2);
    lcd_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, t2, one, NULL, ssum, -1);

    const int64_t *sd = DIM(B, H, S, S), *ss = DIM(H * S * S, S * S, S, 1), *st = DIM(H * S * S, S * S, 1, S);
    /* P recomputed from Stats */
    lcd_t s1 = lcd_virtual(g, CUDNN_DATA_FLOAT, sd, ss), s2 = lcd_virtual(g, CUDNN_DATA_FLOAT, sd, ss);
    lcd_matmul(g, t.q, t.k, s1, t.len_q, t.len_kv, NULL);
    lcd_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s1, t.scale, NULL, s2, -1);
    lcd_t s3 = lca_padding(g, s2, sd, ss, t.len_q, t.len_kv, U_NEGINF_PAD);
    lcd_t s4 = lcd_virtual(g, CUDNN_DATA_FLOAT, sd, ss);
    lcd_pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s3, t.stats, NULL, s4, -1);
    /* cuDNN 9.0 – 9.9: the frontend masks the padding once more after Stats is subtracted */
    p->pad2 = g->api->version < 91000;
    if (p->pad2) s4 = lca_padding(g, s4, sd, ss, t.len_q, t.len_kv, U_NEGINF_PAD2);
    lcd_t s5 = lca_causal(g, s4, sd, ss, U_NEGINF_CAUSAL);
    lcd_t P = lcd_virtual(g, CUDNN_DATA_FLOAT, sd, ss);
    lcd_pointwise(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, s5, NULL, NULL, P, -1);

    /* dV = Pᵀ·dO, over the query heads of each group */
    lcd_t Pt = lcd_virtual(g, CUDNN_DATA_BFLOAT16, sd, st);
    lcd_reshape(g, P, Pt);
    const int64_t *fd = DIM(B, H, S, D), *fs = DIM(H * S * D, S * D, D, 1); /* per query head */
    if (H == G) {
        lcd_matmul(g, Pt, dO, dV, t.len_kv, NULL, t.len_q);
    } else {
        lcd_t dVf = lcd_virtual(g, CUDNN_DATA_BFLOAT16, fd, fs);
        lcd_matmul(g, Pt, dO, dVf, t.len_kv, NULL, t.len_q);
        lcd_reduction(g, CUDNN_REDUCE_TENSOR_ADD, dVf, dV);
    }
    /* dS = P⊙(dO·Vᵀ − Δ)·scale */
    lcd_t dP = lcd_virtual(g, CUDNN_DATA_FLOAT, sd, ss), a = lcd_virtual(g, CUDNN_DATA_FLOAT, sd, ss);
    lcd_t b = lcd_virtual(g, CUDNN_DATA_FLOAT, sd, ss), dS = lcd_virtual(g, CUDNN_DATA_FLOAT, sd, ss);
    lcd_matmul(g, dO, t.v, dP, t.len_q, t.len_kv, NULL);
    lcd_pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dP, ssum, NULL, a, -1);
    lcd_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, a, P, NULL, b, -1);
    lcd_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, b, t.scale, NULL, dS, -1);
    /* dK = dSᵀ·Q, over the query heads of each group */
    lcd_t dSt = lcd_virtual(g, CUDNN_DATA_BFLOAT16, sd, st);
    lcd_reshape(g, dS, dSt);
    if (H == G) {
        lcd_matmul(g, dSt, t.q, dK, t.len_kv, NULL, t.len_q);
    } else {
        lcd_t dKf = lcd_virtual(g, CUDNN_DATA_BFLOAT16, fd, fs);
        lcd_matmul(g, dSt, t.q, dKf, t.len_kv, NULL, t.len_q);
        lcd_reduction(g, CUDNN_REDUCE_TENSOR_ADD, dKf, dK);
    }
    /* dQ = dS·K (K seen as [B, nkv, S, d] again), straight into dQ: the deterministic form */
    lcd_t Kr = lcd_tensor(g, 0, CUDNN_DATA_FLOAT, DIM(B, G, S, D), DIM(S * RG * D, D, RG * D, 1), LCD_VIRTUAL, t.ro_kv);
    lcd_reshape(g, t.k, Kr);
    lcd_matmul(g, dS, Kr, dQ, t.len_q, NULL, t.len_kv);
}

/* ---- plans --------------------------------------------------------------------------------- */

/* The plan of this call's bucket, built on first use, over a's heads in `groups` equal groups
 * of whole GQA groups (1: all of them; more: a backward whose workspace is too large at
 * once, lca_bwd_plan); NULL with *rc = LCU_ENOTSUP when cuDNN has none for it (said once on
 * stderr when last: no other try follows; the bucket stays refused). */
static lca_plan *lca_plan_get(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, bool bwd, int groups, bool last,
                              cudaStream_t s, int *rc)
{
    int B = c->exact_b ? a->nseq : lca_bucket_b(a->nseq), S = lca_bucket_s(max_len > 0 ? max_len : a->total_q);
    int nq = a->nq / groups, nkv = a->nkv / groups;
    lca_plan *p = NULL, *lru = NULL;
    c->tick++;
    for (int i = 0; i < LCA_CAP; i++) {
        lca_plan *x = &c->plans[i];
        if (x->used && x->bwd == bwd && x->B == B && x->S == S && x->nq == nq && x->nkv == nkv && x->rq == a->nq &&
            x->rkv == a->nkv && x->d == a->d) {
            p = x;
            break;
        }
        if (!lru || !x->used || (lru->used && x->last_use < lru->last_use)) lru = x;
    }
    if (p) {
        p->last_use = c->tick;
        if (p->refused) {
            *rc = LCU_ENOTSUP;
            return NULL;
        }
        return p;
    }
    p = lru;
    if (p->used) {
        /* its kernels may still run on the stream (and cuDNN may unload what it compiled) */
        if (c->h) cudaStreamSynchronize(s);
        lcd_graph_free(&p->g);
    }
    memset(p, 0, sizeof *p);
    *p = (lca_plan){true, bwd, false, false, B, S, nq, nkv, a->d, a->nq, a->nkv, {0}, c->tick, 0, 0, -1};
    lcd_graph_init(&p->g, c->api);
    double t0 = clock_mono_s();
    if (bwd) lca_graph_bwd(&p->g, p);
    else lca_graph_fwd(&p->g, p);
    bool planned = !p->g.st && lcd_finish(&p->g, c->h, c->devprop, bwd && !c->any_engine) == 0;
    if (planned && c->ws_max > 0 && p->g.workspace > c->ws_max) {
        p->g.st = CUDNN_STATUS_NOT_SUPPORTED;
        snprintf(p->g.err, sizeof p->g.err, "its workspace of %.0f MiB is over the limit of %.0f MiB "
                 "(LCU_CUDNN_WORKSPACE_MB)", p->g.workspace / 1048576.0, c->ws_max / 1048576.0);
    }
    if (p->g.st || !p->g.plan) {
        if (last || c->verbose)
            fprintf(stderr, "loom cuda: cuDNN attention %s: no plan for %d sequences × %d rows, heads %d/%d × %d%s: "
                    "%s; %s\n", bwd ? "backward" : "forward", B, S, nq, nkv, a->d,
                    groups > 1 ? " (a head group)" : "", p->g.err,
                    last ? "the own kernels run this shape" : "trying smaller head groups");
        p->accepted = p->g.accepted;
        p->workspace = p->g.workspace;
        p->engine = p->g.engine;
        lcd_graph_free(&p->g);
        p->refused = true;
        *rc = LCU_ENOTSUP;
        return NULL;
    }
    if (c->verbose)
        fprintf(stderr, "loom cuda: cuDNN attention %s plan for %d sequences × %d rows, heads %d/%d × %d%s: engine "
                "%lld, workspace %.1f MiB, built in %.0f ms\n", bwd ? "backward" : "forward", B, S, nq, nkv, a->d,
                groups > 1 ? " (in head groups)" : "", (long long)p->g.engine, p->g.workspace / 1048576.0,
                (clock_mono_s() - t0) * 1e3);
    return p;
}

/* ---- workspace ----------------------------------------------------------------------------- */

static size_t lca_align(size_t x) { return (x + 255) & ~(size_t)255; }

/* Pieces of the workspace for one call (byte offsets). */
typedef struct {
    size_t len, ro_qo, ro_kv, ro_st, ssum, dq, dk, dv, dnn, total;
} lca_layout;

static void lca_layout_of(const lca_plan *p, const lcu_attn_desc *a, lca_layout *l)
{
    size_t B = p->B, rows = ((size_t)a->total_q + 63) / 64 * 64, off = 0;
    memset(l, 0, sizeof *l);
    l->len = off, off += lca_align(B * 4);
    l->ro_qo = off, off += lca_align((B + 1) * 8);
    l->ro_kv = off, off += lca_align((B + 1) * 8);
    l->ro_st = off, off += lca_align((B + 1) * 8);
    if (p->bwd) {
        size_t qd = (size_t)a->nq * a->d, kvd = (size_t)a->nkv * a->d;
        l->ssum = off, off += lca_align(rows * a->nq * 4);
        l->dq = off, off += lca_align(rows * qd * 2);
        l->dk = off, off += lca_align(rows * kvd * 2);
        l->dv = off, off += lca_align(rows * kvd * 2);
    }
    l->dnn = off, off += lca_align((size_t)p->g.workspace);
    l->total = off;
}

/* At least bytes of workspace (grown by 1.5× when that fits: a slowly growing workload does
 * not reallocate every call). The old buffer goes only once the new one is there (cudaFree
 * waits for the device, so it is no longer in use); without the memory, LCU_ENOTSUP: this
 * call runs on the own kernels, the context keeps its buffer and cuDNN (one line per size
 * refused, so a batch that does not fit is said once). */
static int lca_reserve(lcu_cudnn *c, size_t bytes)
{
    if (bytes <= c->ws_cap) return 0;
    size_t cap = c->ws_cap + c->ws_cap / 2 > bytes ? c->ws_cap + c->ws_cap / 2 : bytes;
    void *p = NULL;
    if (cudaMalloc(&p, cap) != cudaSuccess) {
        cudaGetLastError();
        cap = bytes;
        if (cudaMalloc(&p, cap) != cudaSuccess) {
            cudaGetLastError();
            if (bytes != c->ws_refused)
                fprintf(stderr, "loom cuda: cuDNN attention: no device memory for a workspace of %.0f MiB; the own "
                        "kernels run this batch\n", bytes / 1048576.0);
            c->ws_refused = bytes;
            return LCU_ENOTSUP;
        }
    }
    if (c->ws) cudaFree(c->ws);
    c->ws = p;
    c->ws_cap = cap;
    return 0;
}

/* Lengths and ragged offsets of this batch into the workspace. */
static int lca_prep(lcu_cudnn *c, const lca_plan *p, const lcu_attn_desc *a, const lca_layout *l, cudaStream_t s)
{
    char *w = c->ws;
    return lcd_ragged_prep(a->q_start, a->nseq, p->B, (int64_t)a->nq * a->d, (int64_t)a->nkv * a->d, a->nq,
                           (int32_t *)(w + l->len), (int64_t *)(w + l->ro_qo), (int64_t *)(w + l->ro_kv),
                           (int64_t *)(w + l->ro_st), s);
}

/* ---- entry points -------------------------------------------------------------------------- */

/* LCU_EINVAL for bad descriptors (as lcu_attn_*), LCU_ENOTSUP for what this path does not
 * take. */
static int lca_check(const lcu_cudnn *c, const lcu_attn_desc *a, int max_len)
{
    if (!c || !a || a->nseq < 0 || a->total_q < 0 || a->nq <= 0 || a->nkv <= 0 || a->nq % a->nkv) return LCU_EINVAL;
    if (a->total_q > 0 && !a->q_start) return LCU_EINVAL;
    if (a->d != 16 && a->d != 32 && a->d != 64 && a->d != 128) return LCU_EINVAL;
    if (a->kv_start || a->kv_len) return LCU_ENOTSUP; /* KV-cache layouts: the own kernels */
    if (max_len < 0 || max_len > a->total_q) return LCU_EINVAL;
    if (a->total_q > (1L << 30)) return LCU_ENOTSUP;
    return 0;
}

/* The caller's tensors of one call, and the backward's bf16 gradients and Δ (workspace
 * pieces), each at its head group's first head. */
typedef struct {
    const void *q, *k, *v, *o, *lse, *dout;
    void *dq, *dk, *dv, *ssum;
} lca_args;

/* Binds the call's tensors, the workspace pieces (base w) and the scalars to the plan's
 * uids and runs it on the handle's stream. */
static int lca_execute(lcu_cudnn *c, const lca_plan *p, const lcu_attn_desc *a, const lca_args *x, char *w,
                       const lca_layout *l, cudaStream_t s)
{
    float scale = a->scale, ninf = c->neg_inf, one = 1.0f;
    int64_t uids[24];
    void *ptrs[24];
    int n = 0;
#define LCA_BIND(u, ptr) (uids[n] = (u), ptrs[n] = (void *)(ptr), n++)
    LCA_BIND(U_Q, x->q);
    LCA_BIND(U_K, x->k);
    LCA_BIND(U_V, x->v);
    LCA_BIND(U_O, x->o);
    LCA_BIND(U_STATS, x->lse);
    LCA_BIND(U_SEQ_Q, w + l->len); /* self-attention: the same lengths for queries and keys */
    LCA_BIND(U_SEQ_KV, w + l->len);
    LCA_BIND(U_RO_QO, w + l->ro_qo);
    LCA_BIND(U_RO_KV, w + l->ro_kv);
    LCA_BIND(U_RO_ST, w + l->ro_st);
    LCA_BIND(U_SCALE, &scale); /* by value: host memory, read during the call */
    LCA_BIND(U_NEGINF_PAD, &ninf);
    LCA_BIND(U_NEGINF_CAUSAL, &ninf);
    if (p->bwd) {
        LCA_BIND(U_DO, x->dout);
        LCA_BIND(U_DQ, x->dq);
        LCA_BIND(U_DK, x->dk);
        LCA_BIND(U_DV, x->dv);
        LCA_BIND(U_SSUM, x->ssum);
        LCA_BIND(U_ONE, &one);
        if (p->pad2) LCA_BIND(U_NEGINF_PAD2, &ninf);
    }
#undef LCA_BIND
    int rc = (int)c->api->SetStream(c->h, s);
    if (!rc) rc = lcd_execute(c->api, c->h, &p->g, n, uids, ptrs, w + l->dnn);
    return rc ? LCU_ECUDNN_BASE + rc : 0;
}

int lcu_cudnn_attn_fwd(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, const lcu_bf16 *q, const lcu_bf16 *k,
                       const lcu_bf16 *v, lcu_bf16 *out, float *lse, cudaStream_t s)
{
    int rc = lca_check(c, a, max_len);
    if (rc) return rc;
    if (a->total_q == 0 || a->nseq == 0) return 0;
    if (!q || !k || !v || !out || !lse) return LCU_EINVAL;
    lca_plan *p = lca_plan_get(c, a, max_len, false, 1, true, s, &rc);
    if (!p) return rc;
    lca_layout l;
    lca_layout_of(p, a, &l);
    if ((rc = lca_reserve(c, l.total)) || (rc = lca_prep(c, p, a, &l, s))) return rc;
    lca_args x = {q, k, v, out, lse, NULL, NULL, NULL, NULL, NULL};
    return lca_execute(c, p, a, &x, c->ws, &l, s);
}

/* Whether a backward may run in g head groups: whole GQA groups (g divides nkv) and each
 * group's first head 16-byte aligned in lse and Δ (fp32 rows of nq: nq/g a multiple of 4). */
static bool lca_groups_ok(const lcu_attn_desc *a, int g)
{
    return g == 1 || (a->nkv % g == 0 && (a->nq / g) % 4 == 0);
}

/* The backward's plan: over all heads at once, else over the fewest equal head groups (2,
 * 4, ...: lca_groups_ok) whose plan cuDNN builds within the workspace limit and, when
 * reserve, whose workspace the device has. The deterministic backward's workspace holds dP,
 * B·heads·S² bf16 (66 GB for one sequence of 32K rows at 32 heads), so a long sequence runs
 * as one call per head group (each head's gradients are its own; a group's dK, dV sum over
 * its own query heads) rather than on the own kernels. *groups, *l: the count, the layout. */
static lca_plan *lca_bwd_plan(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, cudaStream_t s, bool reserve,
                              int *groups, lca_layout *l, int *rc)
{
    for (int g = 1; g <= a->nkv && lca_groups_ok(a, g); g *= 2) {
        bool last = !lca_groups_ok(a, g * 2) || g * 2 > a->nkv;
        lca_plan *p = lca_plan_get(c, a, max_len, true, g, last, s, rc);
        if (!p) {
            if (*rc != LCU_ENOTSUP) return NULL;
            continue;
        }
        lca_layout_of(p, a, l);
        if (reserve && (*rc = lca_reserve(c, l->total))) {
            if (*rc != LCU_ENOTSUP || last) return NULL;
            continue;
        }
        *groups = g;
        *rc = 0;
        return p;
    }
    *rc = LCU_ENOTSUP;
    return NULL;
}

/* The backward's calls, one per head group: the caller's tensors and the workspace's
 * gradients and Δ each at the group's first head, the same ragged offsets (rows of all
 * heads). w: the workspace (a placeholder address in a dry run). */
static int lca_bwd_execute(lcu_cudnn *c, const lca_plan *p, int groups, const lcu_attn_desc *a, const lca_args *x,
                           char *w, const lca_layout *l, cudaStream_t s)
{
    size_t hq = (size_t)a->nq / groups, hk = (size_t)a->nkv / groups, D = (size_t)a->d;
    for (int i = 0; i < groups; i++) {
        size_t oq = i * hq * D, ok = i * hk * D, os = i * hq;
        lca_args y = {(const lcu_bf16 *)x->q + oq, (const lcu_bf16 *)x->k + ok, (const lcu_bf16 *)x->v + ok,
                      (const lcu_bf16 *)x->o + oq, (const float *)x->lse + os, (const lcu_bf16 *)x->dout + oq,
                      (lcu_bf16 *)(w + l->dq) + oq, (lcu_bf16 *)(w + l->dk) + ok, (lcu_bf16 *)(w + l->dv) + ok,
                      (float *)(w + l->ssum) + os};
        int rc = lca_execute(c, p, a, &y, w, l, s);
        if (rc) return rc;
    }
    return 0;
}

int lcu_cudnn_attn_bwd(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, const lcu_bf16 *q, const lcu_bf16 *k,
                       const lcu_bf16 *v, const lcu_bf16 *out, const float *lse, const lcu_bf16 *dout, float *dq,
                       float *dk, float *dv, cudaStream_t s)
{
    int rc = lca_check(c, a, max_len);
    if (rc) return rc;
    if (a->total_q == 0 || a->nseq == 0) return 0;
    if (!q || !k || !v || !out || !lse || !dout || !dq || !dk || !dv) return LCU_EINVAL;
    int groups = 1;
    lca_layout l;
    lca_plan *p = lca_bwd_plan(c, a, max_len, s, true, &groups, &l, &rc);
    if (!p) return rc;
    if ((rc = lca_prep(c, p, a, &l, s))) return rc;
    lca_args x = {q, k, v, out, lse, dout, NULL, NULL, NULL, NULL};
    char *w = c->ws;
    if ((rc = lca_bwd_execute(c, p, groups, a, &x, w, &l, s))) return rc;
    /* cuDNN writes bf16 gradients; the kernel layer's are fp32 */
    size_t T = (size_t)a->total_q;
    if ((rc = lcu_convert(dq, LCU_F32, w + l.dq, LCU_BF16, T * a->nq * a->d, s))) return rc;
    if ((rc = lcu_convert(dk, LCU_F32, w + l.dk, LCU_BF16, T * a->nkv * a->d, s))) return rc;
    return lcu_convert(dv, LCU_F32, w + l.dv, LCU_BF16, T * a->nkv * a->d, s);
}

int lcu_cudnn_dry_run(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, bool bwd)
{
    if (!c || !dlsym(c->api->lib, "loom_cudnn_shim")) return LCU_ENOTSUP;
    int rc = lca_check(c, a, max_len);
    if (rc) return rc;
    if (a->total_q == 0 || a->nseq == 0) return 0;
    /* placeholder addresses, distinct and aligned: the stand-in library reads none of them */
    lca_args x = {(void *)0x10000, (void *)0x20000, (void *)0x30000, (void *)0x40000, (void *)0x50000,
                  bwd ? (void *)0x60000 : NULL, NULL, NULL, NULL, NULL};
    lca_layout l;
    if (bwd) {
        int groups = 1;
        lca_plan *p = lca_bwd_plan(c, a, max_len, 0, false, &groups, &l, &rc);
        return p ? lca_bwd_execute(c, p, groups, a, &x, (char *)0x1000000, &l, 0) : rc;
    }
    lca_plan *p = lca_plan_get(c, a, max_len, false, 1, true, 0, &rc);
    if (!p) return rc;
    lca_layout_of(p, a, &l);
    return lca_execute(c, p, a, &x, (char *)0x1000000, &l, 0);
}

int lcu_cudnn_bwd_groups(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, int *groups, int64_t *workspace,
                         int64_t *engine, int *accepted)
{
    *groups = 0;
    *accepted = 0;
    int rc = lca_check(c, a, max_len);
    if (rc) return rc;
    if (a->total_q == 0 || a->nseq == 0) return LCU_EINVAL;
    for (int g = 1; g <= a->nkv && lca_groups_ok(a, g); g *= 2) {
        bool last = !lca_groups_ok(a, g * 2) || g * 2 > a->nkv;
        lca_plan *p = lca_plan_get(c, a, max_len, true, g, last, 0, &rc), *e = p;
        for (int i = 0; !e && i < LCA_CAP; i++) /* the refused entry just built (or found) */
            if (c->plans[i].used && c->plans[i].last_use == c->tick) e = &c->plans[i];
        if (!e) return rc;
        int acc = p ? p->g.accepted : e->accepted;
        int64_t ws = p ? p->g.workspace : e->workspace;
        if ((p || acc > 0) && (c->ws_max <= 0 || ws <= c->ws_max)) {
            *groups = g;
            *accepted = acc;
            *workspace = ws;
            *engine = p ? p->g.engine : e->engine;
            return p ? 0 : LCU_ENOTSUP;
        }
    }
    return LCU_ENOTSUP;
}

/* An environment switch: set, non-empty and not "0". */
static bool lca_env_on(const char *name)
{
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0;
}

/* A context on api with the environment's switches; NULL when out of host memory. */
static lcu_cudnn *lca_new(const lcd_api *api)
{
    lcu_cudnn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->api = api;
    const char *wsmb = getenv("LCU_CUDNN_WORKSPACE_MB");
    c->verbose = lca_env_on("LCU_CUDNN_VERBOSE");
    c->exact_b = lca_env_on("LCU_CUDNN_EXACT_BATCH");
    c->any_engine = lca_env_on("LCU_CUDNN_ANY_ENGINE");
    /* a plan's own workspace: at most a quarter of the device unless told (the deterministic
     * backward's may grow with B·nq·S²: refused, the own kernels run it, rather than OOM) */
    size_t fr = 0, tot = 0;
    const char *devmb = getenv("LCU_DEVICE_MB"); /* a card of that size (cuda_backend.c) */
    if (wsmb && *wsmb) c->ws_max = (int64_t)strtoll(wsmb, NULL, 10) << 20;
    else if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
        size_t cap = devmb && *devmb ? (size_t)strtoull(devmb, NULL, 10) << 20 : 0;
        c->ws_max = (int64_t)((cap && cap < tot ? cap : tot) / 4);
    } else cudaGetLastError(); /* no device: no limit */
    c->neg_inf = api->version < 91000 ? -FLT_MAX : -INFINITY;
    snprintf(c->desc, sizeof c->desc, "cuDNN %zu.%zu.%zu (%s)", api->version / 10000, api->version / 100 % 100,
             api->version % 100, api->path);
    return c;
}

int lcu_cudnn_create(lcu_cudnn **out, char *why, size_t whylen)
{
    *out = NULL;
    const lcd_api *api = lcd_load(why, whylen);
    if (!api) return LCU_ENOTSUP;
    lcu_cudnn *c = lca_new(api);
    if (!c) {
        snprintf(why, whylen, "out of host memory");
        return LCU_ENOTSUP;
    }
    cudnnStatus_t st = api->Create(&c->h);
    if (st) {
        char m[320];
        lcd_explain(api, st, m, sizeof m);
        snprintf(why, whylen, "%s: cudnnCreate: %s", api->path, m);
        free(c);
        return LCU_ENOTSUP;
    }
    *out = c;
    return 0;
}

int lcu_cudnn_create_deviceless(lcu_cudnn **out, const char *devprop_json, char *why, size_t whylen)
{
    *out = NULL;
    const lcd_api *api = lcd_load(why, whylen);
    if (!api) return LCU_ENOTSUP;
    if (api->version < 90800) {
        snprintf(why, whylen, "%s: plans without a device need cuDNN 9.8", api->path);
        return LCU_ENOTSUP;
    }
    lcu_cudnn *c = lca_new(api);
    if (!c) {
        snprintf(why, whylen, "out of host memory");
        return LCU_ENOTSUP;
    }
    cudnnStatus_t st = api->BackendCreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &c->devprop);
    if (!st)
        st = api->BackendSetAttribute(c->devprop, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                                      (int64_t)strlen(devprop_json), devprop_json);
    if (!st) st = api->BackendFinalize(c->devprop);
    if (st) {
        char m[320];
        lcd_explain(api, st, m, sizeof m);
        snprintf(why, whylen, "%s: the device description: %s", api->path, m);
        if (c->devprop) api->BackendDestroyDescriptor(c->devprop);
        free(c);
        return LCU_ENOTSUP;
    }
    snprintf(c->desc + strlen(c->desc), sizeof c->desc - strlen(c->desc), ", planning without a device");
    *out = c;
    return 0;
}

int lcu_cudnn_plan_check(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, bool bwd, int64_t *workspace,
                         int64_t *engine, int *accepted)
{
    *accepted = 0;
    int rc = lca_check(c, a, max_len);
    if (rc) return rc;
    if (a->total_q == 0 || a->nseq == 0) return LCU_EINVAL;
    lca_plan *p = lca_plan_get(c, a, max_len, bwd, 1, true, 0, &rc);
    if (!p) { /* the refused entry: the one just built (or found) for this bucket */
        for (int i = 0; i < LCA_CAP; i++)
            if (c->plans[i].used && c->plans[i].last_use == c->tick) {
                *accepted = c->plans[i].accepted;
                *workspace = c->plans[i].workspace;
                *engine = c->plans[i].engine;
            }
        return rc;
    }
    *workspace = p->g.workspace;
    *engine = p->g.engine;
    *accepted = p->g.accepted;
    return 0;
}

void lcu_cudnn_destroy(lcu_cudnn *c)
{
    if (!c) return;
    if (c->h) cudaDeviceSynchronize(); /* nothing of cuDNN's may still run when its plans go */
    for (int i = 0; i < LCA_CAP; i++)
        if (c->plans[i].used) lcd_graph_free(&c->plans[i].g);
    if (c->ws) cudaFree(c->ws);
    if (c->devprop) c->api->BackendDestroyDescriptor(c->devprop);
    if (c->h) c->api->Destroy(c->h);
    free(c);
}

const char *lcu_cudnn_describe(const lcu_cudnn *c) { return c ? c->desc : "cuDNN: none"; }

size_t lcu_cudnn_workspace_bytes(const lcu_cudnn *c) { return c ? c->ws_cap : 0; }

int lcu_cudnn_plans(const lcu_cudnn *c, int *refused)
{
    int n = 0, r = 0;
    for (int i = 0; c && i < LCA_CAP; i++) {
        if (!c->plans[i].used) continue;
        if (c->plans[i].refused) r++;
        else n++;
    }
    if (refused) *refused = r;
    return n;
}

const char *lcu_cudnn_strerror(int rc)
{
    if (rc == LCU_ENOTSUP) return "not supported by the cuDNN path (the own kernels run it)";
    if (rc >= LCU_ECUDNN_BASE) {
        const lcd_api *api = lcd_load(NULL, 0);
        return api ? api->GetErrorString((cudnnStatus_t)(rc - LCU_ECUDNN_BASE)) : "cuDNN error";
    }
    return lcu_strerror(rc);
}

#else /* built without cuDNN's headers: the own kernels only */

struct lcu_cudnn {
    int unused;
};

int lcu_cudnn_create(lcu_cudnn **out, char *why, size_t whylen)
{
    *out = NULL;
    snprintf(why, whylen, "built without cuDNN's headers (cudnn_graph.h was not found next to the CUDA toolkit's)");
    return LCU_ENOTSUP;
}

void lcu_cudnn_destroy(lcu_cudnn *c) { (void)c; }
const char *lcu_cudnn_describe(const lcu_cudnn *c) { return "cuDNN: not built"; }

int lcu_cudnn_attn_fwd(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, const lcu_bf16 *q, const lcu_bf16 *k,
                       const lcu_bf16 *v, lcu_bf16 *out, float *lse, cudaStream_t s)
{
    return LCU_ENOTSUP;
}

int lcu_cudnn_attn_bwd(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, const lcu_bf16 *q, const lcu_bf16 *k,
                       const lcu_bf16 *v, const lcu_bf16 *out, const float *lse, const lcu_bf16 *dout, float *dq,
                       float *dk, float *dv, cudaStream_t s)
{
    return LCU_ENOTSUP;
}

int lcu_cudnn_plans(const lcu_cudnn *c, int *refused)
{
    if (refused) *refused = 0;
    return 0;
}

int lcu_cudnn_dry_run(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, bool bwd) { return LCU_ENOTSUP; }
int lcu_cudnn_bwd_groups(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, int *groups, int64_t *workspace,
                         int64_t *engine, int *accepted)
{
    *groups = 0;
    *accepted = 0;
    return LCU_ENOTSUP;
}

size_t lcu_cudnn_workspace_bytes(const lcu_cudnn *c) { return 0; }

int lcu_cudnn_create_deviceless(lcu_cudnn **out, const char *devprop_json, char *why, size_t whylen)
{
    return lcu_cudnn_create(out, why, whylen);
}

int lcu_cudnn_plan_check(lcu_cudnn *c, const lcu_attn_desc *a, int max_len, bool bwd, int64_t *workspace,
                         int64_t *engine, int *accepted)
{
    *accepted = 0;
    return LCU_ENOTSUP;
}

const char *lcu_cudnn_strerror(int rc)
{
    if (rc == LCU_ENOTSUP) return "not supported by the cuDNN path (the own kernels run it)";
    if (rc >= LCU_ECUDNN_BASE) return "cuDNN error";
    return lcu_strerror(rc);
}

#endif /* LOOM_HAVE_CUDNN_H */
