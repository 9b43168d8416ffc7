/* cuda_prof.c — the decode profile's per-operation table (LCU_DECODE_PROFILE=2; see
 * cuda_prof.h), a measurement aid for the decode speed work: the first level says that a
 * decode step's layer stack is far from its bandwidth bound, this one says which of the
 * layer's operations take the time.
 *
 * A profiled pass records an event at its start and one after each marked operation
 * (cu_mark), in the order queued on the one stream; the interval between an event and the
 * previous one is the marked operation's. The passes run eagerly (events between the
 * operations would be one graph node each, and the point is to see the operations as they
 * are): an interval therefore also holds any time the device waited for the host to queue
 * the operation, which is why the table says how long the host took to queue a pass. The
 * events of a pass are made once and reused by the next (a pass of Qwen3-8B marks ~900). */
#include "backend/cuda/cuda_prof.h"
#include "common/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CO_LABELS 96 /* distinct labels a table holds (a dense layer marks ~25 forward, ~30 backward) */

struct cu_ops_prof {
    cudaEvent_t *ev;            /* [cap], made as needed */
    int *lab;                   /* [cap] label of the interval that ends at ev[i] (-1: the start) */
    int n, cap;                 /* events recorded in the open pass */
    bool open;                  /* a decode pass is being queued */
    const char *name[CO_LABELS];
    double ms[CO_LABELS];       /* summed over the steps */
    long calls[CO_LABELS];
    int nlab;
    long steps;
    double host_ms;             /* the host's time to queue the passes, summed */
    long lost;                  /* marks or intervals missed (events refused, labels full) */
};

void cu_ops_begin(cu_ctx *c)
{
    if (!c->dops) c->dops = calloc(1, sizeof *c->dops);
}

static int co_label(cu_ops_prof *p, const char *label)
{
    for (int i = 0; i < p->nlab; i++)
        if (p->name[i] == label || !strcmp(p->name[i], label)) return i;
    if (p->nlab == CO_LABELS) return -1;
    p->name[p->nlab] = label;
    return p->nlab++;
}

/* An event after what the stream holds now, ending an interval of label lab. The profile
 * never fails sampling: an event the runtime refuses is counted as lost and its error
 * cleared. */
static void co_record(cu_ctx *c, cu_ops_prof *p, int lab)
{
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 1024;
        cudaEvent_t *ev = realloc(p->ev, cap * sizeof *ev);
        if (ev) p->ev = ev;
        int *l = ev ? realloc(p->lab, cap * sizeof *l) : NULL;
        if (l) p->lab = l;
        if (!ev || !l) { p->lost++; return; }
        for (; p->cap < cap; p->cap++)
            if (cudaEventCreate(&p->ev[p->cap]) != cudaSuccess) {
                cudaGetLastError();
                p->lost++;
                break;
            }
        if (p->n == p->cap) return;
    }
    if (cudaEventRecord(p->ev[p->n], c->stream) != cudaSuccess) {
        cudaGetLastError();
        p->lost++;
        return;
    }
    p->lab[p->n++] = lab;
}

void cu_ops_mark_on(cu_ctx *c, const char *label)
{
    cu_ops_prof *p = c->dops;
    if (!p->open) return; /* a prefill or training pass of a profiled context */
    int lab = co_label(p, label);
    if (lab < 0) p->lost++; /* its time goes to the next mark's label */
    else co_record(c, p, lab);
}

void cu_ops_open(cu_ctx *c)
{
    cu_ops_prof *p = c->dops;
    if (!p) return;
    p->n = 0;
    p->open = true;
    co_record(c, p, -1);
}

void cu_ops_close(cu_ctx *c, double host_ms)
{
    if (!c->dops) return;
    c->dops->open = false;
    c->dops->host_ms += host_ms;
}

void cu_ops_step(cu_ctx *c)
{
    cu_ops_prof *p = c->dops;
    if (!p) return;
    for (int i = 1; i < p->n; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]) != cudaSuccess) {
            cudaGetLastError();
            p->lost++;
            continue;
        }
        if (p->lab[i] < 0) continue;
        p->ms[p->lab[i]] += ms;
        p->calls[p->lab[i]]++;
    }
    if (p->n > 1) p->steps++;
    p->n = 0;
}

/* Largest share first: the table is read from the top. kind: "decode" or "train"; what:
 * the passes' description; unit: "step" or "pass". */
static void co_print(const cu_ctx *c, const cu_ops_prof *p, const char *kind, const char *what, const char *unit)
{
    int ord[CO_LABELS], L = c->cfg.num_hidden_layers;
    double n = (double)p->steps, total = 0;
    for (int i = 0; i < p->nlab; i++) {
        total += p->ms[i];
        int j = i;
        for (; j > 0 && p->ms[ord[j - 1]] < p->ms[i]; j--) ord[j] = ord[j - 1];
        ord[j] = i;
    }
    fprintf(stderr, "loom cuda:%d: %s ops, %s, %d layers, per %s: %.3f ms from the pass's start to its last mark "
            "(eager passes, an event after each operation: an operation's time includes any wait for the host, "
            "which queued a pass in %.3f ms)%s\n", c->device, kind, what, L, unit, total / n, p->host_ms / n,
            p->lost ? "; some marks were lost (events refused or too many labels): their time counts in the next row"
                    : "");
    for (int k = 0; k < p->nlab; k++) {
        int i = ord[k];
        fprintf(stderr, "loom cuda:%d: %s ops   %-16s %8.3f ms %9.2f us/layer %5.1f %%  %4.0f calls/%s\n", c->device,
                kind, p->name[i], p->ms[i] / n, 1e3 * p->ms[i] / n / L, total > 0 ? 100 * p->ms[i] / total : 0.0,
                p->calls[i] / n, unit);
    }
}

static void co_free(cu_ops_prof *p)
{
    for (int i = 0; i < p->cap; i++) cudaEventDestroy(p->ev[i]);
    free(p->ev);
    free(p->lab);
    free(p);
}

/* ---- training passes (LCU_TRAIN_PROFILE=1) ----------------------------------------------- */

/* The passes of one shape (tokens, sequences, whether gradients enter the layers) are
 * summed into one table, said when the shape changes and when the context goes. The first
 * pass of a shape builds what the later ones reuse (cuBLASLt's heuristics, cuDNN's plans:
 * ~50 ms each on an H200, the workspaces): once a second pass comes, the table holds the
 * passes after the first only. */
static void co_clear_sums(cu_ops_prof *p)
{
    p->steps = 0;
    p->host_ms = 0;
    p->lost = 0;
    memset(p->ms, 0, sizeof p->ms);
    memset(p->calls, 0, sizeof p->calls);
}

/* The table of the training shape summed so far, then its sums cleared (the events stay,
 * for the next shape's passes). */
static void co_say_train(cu_ctx *c)
{
    cu_ops_prof *p = c->tops;
    if (p->steps > 0 && p->nlab > 0) {
        char passes[80], what[192];
        if (c->tprof_passes > 1) snprintf(passes, sizeof passes, "%ld passes after the shape's first", p->steps);
        else snprintf(passes, sizeof passes, "1 pass, the shape's first (plans and workspaces built in it)");
        snprintf(what, sizeof what, "%ld tokens in %d sequences, %s, %s", c->tprof_T, c->tprof_nseq,
                 c->tprof_grad ? "forward+backward" : "forward (no gradient into the layers)", passes);
        co_print(c, p, "train", what, "pass");
    }
    p->nlab = 0;
    co_clear_sums(p);
    c->tprof_passes = 0;
}

void cu_train_prof_begin(cu_ctx *c, long T, int nseq, bool layer_grad)
{
    if (!c->tprof_wanted || c->dops) return; /* a sampling call's profile is recording */
    if (c->tops && (c->tprof_T != T || c->tprof_nseq != nseq || c->tprof_grad != layer_grad)) co_say_train(c);
    if (!c->tops) c->tops = calloc(1, sizeof *c->tops);
    if (!c->tops) return;
    c->tprof_T = T;
    c->tprof_nseq = nseq;
    c->tprof_grad = layer_grad;
    c->dops = c->tops; /* cu_mark records into whichever profile c->dops holds */
    c->tprof_t0 = clock_mono_s();
    c->tprof_host_ms = 0;
    cu_ops_open(c);
}

void cu_train_prof_queued(cu_ctx *c)
{
    if (c->tops && c->dops == c->tops) c->tprof_host_ms = (clock_mono_s() - c->tprof_t0) * 1e3;
}

void cu_train_prof_end(cu_ctx *c, bool ok)
{
    if (!c->tops || c->dops != c->tops) return;
    if (ok && ++c->tprof_passes == 2) co_clear_sums(c->tops); /* the shape's first pass out (above) */
    cu_ops_close(c, c->tprof_host_ms);
    if (ok) cu_ops_step(c); /* the pass synchronized: its events are complete */
    else c->tops->n = 0;
    c->dops = NULL;
}

void cu_train_prof_flush(cu_ctx *c)
{
    if (!c->tops) return;
    co_say_train(c);
    co_free(c->tops);
    c->tops = NULL;
}

void cu_ops_end(cu_ctx *c, int S, int nad)
{
    cu_ops_prof *p = c->dops;
    if (!p) return;
    if (p->steps > 0 && p->nlab > 0) {
        char what[128];
        snprintf(what, sizeof what, "%d samples on %d adapters, %ld steps", S, nad, p->steps);
        co_print(c, p, "decode", what, "step");
    }
    co_free(p);
    c->dops = NULL;
}
