/* lcu_lora.cu — LoRA over segments of rows, one adapter (and rank) per segment (see
 * cuda_ops.h). Version 1: per-segment GEMMs through lcu_gemm, in segment order, with the
 * CPU backend's sequence of products (cpu_layer.c cpu_lora_fwd_rows / cpu_lora_bwd_rows):
 *
 *   forward   z = x Aᵀ (bf16)              y += scale·z Bᵀ
 *   backward  z = x Aᵀ (recomputed)        gB += scale·dyᵀ z
 *             dz = scale·dy B (bf16)       gA += dzᵀ x          dx += dz A
 *
 * Each segment uses its own rows of the z/dz workspaces, so a grouped kernel (all segments
 * in one launch, SGMV style) can replace the loops here without changing the interface;
 * the gradient products keep a fixed order either way (deterministic). Versions 2
 * (lcu_sgmv.cu, LCU_LORA=sgmv) and 3 (lcu_sgmv3.cu, LCU_LORA=sgmv3, and auto's pick for
 * several segments: lcu_lora_version) do that: calls whose segments are sorted and disjoint
 * in rows (the backend's always are) go there.
 */
#include "backend/cuda/lcu_common.cuh"
#include "backend/cuda/lcu_sgmv.cuh"

int lcu_lora_ldz(int max_rank) { return ((max_rank > 1 ? max_rank : 1) + 7) / 8 * 8; }

static int lcu_lora_check(const lcu_lora_seg *segs, int nseg, int in, int out, const void *x, long ldx,
                          const void *y, long ldy, const void *z, long ldz)
{
    if (nseg < 0 || (nseg && !segs) || in <= 0 || out <= 0 || ldx < in || ldy < out) return LCU_EINVAL;
    for (int i = 0; i < nseg; i++) {
        const lcu_lora_seg *g = &segs[i];
        if (g->row_end < g->row_begin || g->row_begin < 0 || g->rank < 1 || !g->A || !g->B || ldz < g->rank)
            return LCU_EINVAL;
    }
    if (nseg && (!x || !y || !z)) return LCU_EINVAL;
    return 0;
}

/* Version 2 wants each row in at most one segment (its segments run at once). */
static bool lcu_lora_disjoint(const lcu_lora_seg *segs, int nseg)
{
    for (int i = 1; i < nseg; i++)
        if (segs[i].row_begin < segs[i - 1].row_end) return false;
    return true;
}

/* The LoRA version (1, 2 or 3) a call over these segments (sorted and disjoint) runs:
 * LCU_LORA=gemm 1, sgmv 2, sgmv3 3, else auto. */
static int lcu_lora_version(const lcu_lora_seg *segs, int nseg)
{
    const char *e = getenv("LCU_LORA");
    if (e && !strcmp(e, "gemm")) return 1;
    if (e && !strcmp(e, "sgmv")) return 2;
    if (e && !strcmp(e, "sgmv3")) return 3;
    /* auto (the default): version 3 for calls of LCU_LORA_AUTO_MIN non-empty segments or more
     * (default 2) averaging at most LCU_LORA_AUTO_ROWS rows (default 2048); else version 1,
     * cuBLASLt per segment. Measured on an H200 (bench/cuda/WINDOWS.md, 2026-11-27, fourth
     * window): Qwen3-0.6B forward+backward 32×256 rows over 8 adapters 66,040 tok/s on
     * version 3 against 53,736 on the previous rule (over 32: 63,292 against 41,885; 8×512
     * over 8: 58,629 against 36,214), Qwen3-8B decode over 8 adapters 18.27 ms a step
     * against 26.86. Its q kernel rows beat version 2 at every size and version 1 at 8 and
     * 32 segments up to 1,024 rows each (4,096: version 1 1.45 ms against 1.80). One
     * segment stays on version 1 (the model's one-adapter rows: 78,318 tok/s against
     * version 3's 64,412). */
    const char *m = getenv("LCU_LORA_AUTO_MIN"), *r = getenv("LCU_LORA_AUTO_ROWS");
    int min = m && *m ? atoi(m) : 2;
    long max_rows = r && *r ? atol(r) : 2048, rows = 0;
    int n = 0;
    for (int i = 0; i < nseg; i++)
        if (segs[i].row_end > segs[i].row_begin) {
            n++;
            rows += segs[i].row_end - segs[i].row_begin;
        }
    return n >= (min > 1 ? min : 1) && rows <= (long)n * (max_rows > 0 ? max_rows : 1) ? 3 : 1;
}

/* Whether every non-empty segment carries its gradients (versions 2 and 3 need them). */
static bool lcu_lora_has_grads(const lcu_lora_seg *segs, int nseg)
{
    for (int i = 0; i < nseg; i++)
        if (segs[i].row_end > segs[i].row_begin && (!segs[i].gA || !segs[i].gB)) return false;
    return true;
}

static int lcu_lora_z(lcu_ctx *c, const lcu_lora_seg *g, int in, const lcu_bf16 *x, long ldx, lcu_bf16 *z, long ldz,
                      cudaStream_t s)
{
    int rows = (int)(g->row_end - g->row_begin);
    lcu_gemm_args a = {false, true, rows, g->rank, in, 1.0f, 0.0f, x + g->row_begin * ldx, ldx, g->A, in,
                       NULL, 0, z + g->row_begin * ldz, ldz, LCU_BF16};
    return lcu_gemm(c, &a, s);
}

/* Version 1's forward of one segment (cuBLASLt): z = x Aᵀ over its rows, then y = scale·z
 * Bᵀ + beta·C, C NULL adding to y itself. */
static int lcu_lora_seg_fwd(lcu_ctx *c, const lcu_lora_seg *g, int in, int out, const lcu_bf16 *x, long ldx,
                            float beta, const float *C, long ldc, float *y, long ldy, lcu_bf16 *z, long ldz,
                            cudaStream_t s)
{
    int rows = (int)(g->row_end - g->row_begin);
    if (rows == 0) return 0;
    int rc = lcu_lora_z(c, g, in, x, ldx, z, ldz, s);
    lcu_gemm_args e = {false, true, rows, out, g->rank, g->scale, beta, z + g->row_begin * ldz, ldz, g->B, g->rank,
                       C ? C + g->row_begin * ldc : NULL, ldc, y + g->row_begin * ldy, ldy, LCU_F32};
    return rc ? rc : lcu_gemm(c, &e, s);
}

int lcu_lora_fwd(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x, long ldx,
                 float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s)
{
    int rc = lcu_lora_check(segs, nseg, in, out, x, ldx, y, ldy, z, ldz);
    int v = !rc && nseg && lcu_lora_disjoint(segs, nseg) ? lcu_lora_version(segs, nseg) : 1;
    if (v == 3) return lcu_sgmv3_lora_fwd(c, segs, nseg, in, out, x, ldx, y, ldy, z, ldz, s);
    if (v == 2) return lcu_sgmv_lora_fwd(c, segs, nseg, in, out, x, ldx, y, ldy, z, ldz, s);
    for (int i = 0; i < nseg && !rc; i++)
        rc = lcu_lora_seg_fwd(c, &segs[i], in, out, x, ldx, 1.0f, NULL, 0, y, ldy, z, ldz, s);
    return rc;
}

/* The largest rank of the segments (0: none). */
static int lcu_lora_max_rank(const lcu_lora_seg *segs, int nseg)
{
    int r = 0;
    for (int i = 0; i < nseg; i++) r = segs[i].rank > r ? segs[i].rank : r;
    return r;
}

/* Whether a module's segments (none included) take version 3. */
static bool lcu_lora_mod_v3(const lcu_lora_mod *d)
{
    return !d->nseg || (lcu_lora_disjoint(d->segs, d->nseg) && lcu_lora_version(d->segs, d->nseg) == 3);
}

/* lcu_lora_fwd_multi's arguments checked; *v3 whether every module's segments take
 * version 3. 0 or LCU_EINVAL. */
static int lcu_lora_multi_check(const lcu_lora_mod *mods, int nmod, int in, const lcu_bf16 *x, long ldx,
                                const float *y, long ldy, const lcu_bf16 *z, long ldz, bool *v3)
{
    if (nmod < 0 || (nmod && !mods)) return LCU_EINVAL;
    *v3 = true;
    for (int m = 0; m < nmod; m++) {
        const lcu_lora_mod *d = &mods[m];
        if (d->ycol < 0 || d->zcol < 0 || d->ycol >= ldy || d->zcol >= ldz) return LCU_EINVAL;
        int rc = lcu_lora_check(d->segs, d->nseg, in, d->out, x, ldx, y, ldy - d->ycol, z, ldz - d->zcol);
        if (rc) return rc;
        *v3 &= lcu_lora_mod_v3(d);
    }
    for (int m = 0; m < nmod; m++) { /* the modules' z columns apart */
        int rm = lcu_lora_max_rank(mods[m].segs, mods[m].nseg);
        for (int q = 0; q < m; q++) {
            int rq = lcu_lora_max_rank(mods[q].segs, mods[q].nseg);
            if (rm && rq && mods[m].zcol < mods[q].zcol + rq && mods[q].zcol < mods[m].zcol + rm) return LCU_EINVAL;
        }
    }
    return 0;
}

bool lcu_lora_fwd_multi_splits(const lcu_lora_mod *mods, int nmod)
{
    if (nmod <= 0 || !mods) return false;
    for (int m = 0; m < nmod; m++)
        if (!lcu_lora_mod_v3(&mods[m])) return false;
    return true;
}

int lcu_lora_fwd_multi_part(lcu_ctx *c, bool z_part, const lcu_lora_mod *mods, int nmod, int in, const lcu_bf16 *x,
                            long ldx, float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s)
{
    bool v3;
    int rc = lcu_lora_multi_check(mods, nmod, in, x, ldx, y, ldy, z, ldz, &v3);
    if (rc) return rc;
    if (!v3) return LCU_ENOTSUP;
    return lcu_sgmv3_lora_fwd_multi_part(c, z_part, mods, nmod, in, x, ldx, y, ldy, z, ldz, s);
}

int lcu_lora_fwd_multi(lcu_ctx *c, const lcu_lora_mod *mods, int nmod, int in, const lcu_bf16 *x, long ldx, float *y,
                       long ldy, lcu_bf16 *z, long ldz, cudaStream_t s)
{
    bool v3;
    int rc = lcu_lora_multi_check(mods, nmod, in, x, ldx, y, ldy, z, ldz, &v3);
    if (rc) return rc;
    if (v3) return lcu_sgmv3_lora_fwd_multi(c, mods, nmod, in, x, ldx, y, ldy, z, ldz, s);
    /* one module after another, each through z's first columns (as a call of its own: the
     * same pointers, so the same cuBLASLt algorithms) */
    for (int m = 0; m < nmod && !rc; m++)
        rc = lcu_lora_fwd(c, mods[m].segs, mods[m].nseg, in, mods[m].out, x, ldx, y + mods[m].ycol, ldy, z, ldz, s);
    return rc;
}

/* Whether the segments tile rows 0 .. rows − 1 in order, without a gap (every row written). */
static bool lcu_lora_tile(const lcu_lora_seg *segs, int nseg, long rows)
{
    long next = 0;
    for (int i = 0; i < nseg; i++) {
        if (segs[i].row_begin != next) return false;
        next = segs[i].row_end;
    }
    return next == rows;
}

int lcu_lora_fwd_into(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, long rows, int in, int out, const lcu_bf16 *x,
                      long ldx, const float *C, long ldc, float *y, long ldy, lcu_bf16 *z, long ldz, cudaStream_t s)
{
    int rc = lcu_lora_check(segs, nseg, in, out, x, ldx, y, ldy, z, ldz);
    if (rc) return rc;
    if (rows < 0 || (C && ldc < out)) return LCU_EINVAL;
    int v = nseg ? lcu_lora_version(segs, nseg) : 1;
    if (!lcu_lora_tile(segs, nseg, rows) || v == 2 || (v == 3 && C)) return LCU_ENOTSUP;
    if (v == 3) return lcu_sgmv3_lora_fwd_write(c, segs, nseg, in, out, x, ldx, y, ldy, z, ldz, s);
    for (int i = 0; i < nseg && !rc; i++)
        rc = lcu_lora_seg_fwd(c, &segs[i], in, out, x, ldx, C ? 1.0f : 0.0f, C, ldc, y, ldy, z, ldz, s);
    return rc;
}

/* Version 1's backward (cuBLASLt per segment); dx = dz A + dx_beta·dx per segment. */
static int lcu_lora_bwd_v1(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x,
                           long ldx, const lcu_bf16 *dy, long lddy, float *dx, long lddx, float dx_beta, lcu_bf16 *z,
                           lcu_bf16 *dz, long ldz, cudaStream_t s)
{
    int rc = 0;
    for (int i = 0; i < nseg && !rc; i++) {
        const lcu_lora_seg *g = &segs[i];
        int rows = (int)(g->row_end - g->row_begin), r = g->rank;
        if (rows == 0) continue;
        if (!g->gA || !g->gB) return LCU_EINVAL;
        const lcu_bf16 *xs = x + g->row_begin * ldx, *dys = dy + g->row_begin * lddy;
        lcu_bf16 *zs = z + g->row_begin * ldz, *dzs = dz + g->row_begin * ldz;
        rc = lcu_lora_z(c, g, in, x, ldx, z, ldz, s);
        lcu_gemm_args gb = {true, false, out, r, rows, g->scale, 1.0f, dys, lddy, zs, ldz, NULL, 0, g->gB, r, LCU_F32};
        lcu_gemm_args d = {false, false, rows, r, out, g->scale, 0.0f, dys, lddy, g->B, r, NULL, 0, dzs, ldz, LCU_BF16};
        lcu_gemm_args ga = {true, false, r, in, rows, 1.0f, 1.0f, dzs, ldz, xs, ldx, NULL, 0, g->gA, in, LCU_F32};
        lcu_gemm_args gx = {false, false, rows, in, r, 1.0f, dx_beta, dzs, ldz, g->A, in, NULL, 0,
                            dx ? dx + g->row_begin * lddx : NULL, lddx, LCU_F32};
        if (!rc) rc = lcu_gemm(c, &gb, s);
        if (!rc) rc = lcu_gemm(c, &d, s);
        if (!rc) rc = lcu_gemm(c, &ga, s);
        if (!rc && dx) rc = lcu_gemm(c, &gx, s);
    }
    return rc;
}

int lcu_lora_bwd(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, int in, int out, const lcu_bf16 *x, long ldx,
                 const lcu_bf16 *dy, long lddy, float *dx, long lddx, lcu_bf16 *z, lcu_bf16 *dz, long ldz,
                 cudaStream_t s)
{
    int rc = lcu_lora_check(segs, nseg, in, out, x, ldx, dy, lddy, z, ldz);
    if (rc) return rc;
    if ((dx && lddx < in) || (nseg && !dz)) return LCU_EINVAL;
    int v = nseg && lcu_lora_disjoint(segs, nseg) ? lcu_lora_version(segs, nseg) : 1;
    if (v > 1) {
        if (!lcu_lora_has_grads(segs, nseg)) return LCU_EINVAL;
        if (v == 3) return lcu_sgmv3_lora_bwd(c, segs, nseg, in, out, x, ldx, dy, lddy, dx, lddx, z, dz, ldz, s);
        return lcu_sgmv_lora_bwd(c, segs, nseg, in, out, x, ldx, dy, lddy, dx, lddx, z, dz, ldz, s);
    }
    return lcu_lora_bwd_v1(c, segs, nseg, in, out, x, ldx, dy, lddy, dx, lddx, 1.0f, z, dz, ldz, s);
}

int lcu_lora_bwd_into(lcu_ctx *c, const lcu_lora_seg *segs, int nseg, long rows, int in, int out,
                      const lcu_bf16 *x, long ldx, const lcu_bf16 *dy, long lddy, float *dx, long lddx, bool acc,
                      lcu_bf16 *z, lcu_bf16 *dz, long ldz, cudaStream_t s)
{
    int rc = lcu_lora_check(segs, nseg, in, out, x, ldx, dy, lddy, z, ldz);
    if (rc) return rc;
    if (!dx || lddx < in || (nseg && !dz)) return LCU_EINVAL;
    int v = nseg ? lcu_lora_version(segs, nseg) : 1;
    if (!lcu_lora_tile(segs, nseg, rows) || v == 2) return LCU_ENOTSUP;
    if (v == 3) { /* version 3's dx product writing (or adding, acc) */
        if (!lcu_lora_has_grads(segs, nseg)) return LCU_EINVAL;
        return acc ? lcu_sgmv3_lora_bwd(c, segs, nseg, in, out, x, ldx, dy, lddy, dx, lddx, z, dz, ldz, s)
                   : lcu_sgmv3_lora_bwd_write(c, segs, nseg, in, out, x, ldx, dy, lddy, dx, lddx, z, dz, ldz, s);
    }
    return lcu_lora_bwd_v1(c, segs, nseg, in, out, x, ldx, dy, lddy, dx, lddx, acc ? 1.0f : 0.0f, z, dz, ldz, s);
}
