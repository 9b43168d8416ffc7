/* elementwise_emu.cpp — the memory-bound kernels of backend/cuda/lcu_elementwise.cu through the
 * CPU emulation of include/emu.h: conversions, SwiGLU forward and backward in their 4-wide and
 * scalar forms (the same bits, tails of 1–3 elements, nothing written past n), RoPE and RMSNorm
 * against plain loops. Built and run by `run_emu.sh elementwise`; a development check of the
 * kernels' index logic before a GPU window, not a GPU pass (test_gpu_ops is). */
#include "emu.h"
#include "backend/cuda/cuda_ops.h"
#include <random>
#include <vector>
static int fails, checks;
#define CHECK(c, ...)                              \
    do {                                           \
        bool ok_ = (c);                            \
        checks++;                                  \
        fails += !ok_;                             \
        printf("%s", ok_ ? "ok   " : "FAIL ");     \
        printf(__VA_ARGS__);                       \
        printf("\n");                              \
    } while (0)
static unsigned short bf(float f) { __nv_bfloat16 h = __float2bfloat16_rn(f); return h.__x; }
int main()
{
    std::mt19937 g(5);
    std::uniform_real_distribution<float> U(-6, 6);
    for (long n : {1L, 3L, 4L, 7L, 1000L, 1003L}) {
        std::vector<float> a(n + 1), b(n + 1), d(n + 1);
        for (long i = 0; i <= n; i++) { a[i] = U(g); b[i] = U(g); d[i] = U(g); }
        float *A = (float *)aligned_alloc(64, 4 * (n + 8)), *B = (float *)aligned_alloc(64, 4 * (n + 8)), *Dh = (float *)aligned_alloc(64, 4 * (n + 8));
        memcpy(A, a.data(), 4 * (n + 1)); memcpy(B, b.data(), 4 * (n + 1)); memcpy(Dh, d.data(), 4 * (n + 1));
        unsigned short *h1 = (unsigned short *)aligned_alloc(64, 2 * (n + 8)), *h2 = (unsigned short *)aligned_alloc(64, 2 * (n + 8));
        memset(h1, 0xff, 2 * (n + 8)); memset(h2, 0xff, 2 * (n + 8));
        lcu_convert(h1, LCU_BF16, A, LCU_F32, n, 0);               /* 4-wide */
        lcu_convert(h2 + 1, LCU_BF16, A + 1, LCU_F32, n - 1 > 0 ? n - 1 : 0, 0); /* scalar */
        bool ok = true;
        for (long i = 0; i < n; i++) ok &= h1[i] == bf(A[i]);
        for (long i = 1; i < n; i++) ok &= h2[i] == h1[i];
        ok &= h1[n] == 0xffff;
        CHECK(ok, "convert f32->bf16 n=%ld", n);
        float *f1 = (float *)aligned_alloc(64, 4 * (n + 8));
        lcu_convert(f1, LCU_F32, h1, LCU_BF16, n, 0);
        ok = true;
        for (long i = 0; i < n; i++) { __nv_bfloat16 t; t.__x = h1[i]; ok &= f1[i] == __bfloat162float(t); }
        CHECK(ok, "convert bf16->f32 n=%ld", n);
        memset(h1, 0xff, 2 * (n + 8)); memset(h2, 0xff, 2 * (n + 8));
        lcu_swiglu_fwd(h1, LCU_BF16, A, B, n, 0);
        lcu_swiglu_fwd(h2 + 1, LCU_BF16, A + 1, B + 1, n - 1 > 0 ? n - 1 : 0, 0);
        ok = h1[n] == 0xffff;
        for (long i = 0; i < n; i++) ok &= h1[i] == bf(A[i] / (1.0f + expf(-A[i])) * B[i]);
        for (long i = 1; i < n; i++) ok &= h2[i] == h1[i];
        CHECK(ok, "swiglu fwd n=%ld", n);
        float *g1 = (float *)aligned_alloc(64, 4 * (n + 8)), *u1 = (float *)aligned_alloc(64, 4 * (n + 8));
        for (long i = 0; i < n + 8; i++) g1[i] = u1[i] = NAN;
        lcu_swiglu_bwd(g1, u1, LCU_F32, Dh, A, B, n, 0);
        ok = std::isnan(g1[n]) && std::isnan(u1[n]);
        for (long i = 0; i < n; i++) {
            float x = A[i], sg = 1.0f / (1.0f + expf(-x)), dd = Dh[i];
            ok &= g1[i] == dd * B[i] * sg * (1.0f + x * (1.0f - sg)) && u1[i] == dd * x * sg;
        }
        CHECK(ok, "swiglu bwd n=%ld", n);
        free(A); free(B); free(Dh); free(h1); free(h2); free(f1); free(g1); free(u1);
    }
    /* rope: T=5, nh=3, d=8 */
    {
        int T = 5, nh = 3, d = 8, half = 4, P = 10;
        std::vector<float> in(T * nh * d), cs(P * half), sn(P * half), out(T * nh * d);
        for (auto &x : in) x = U(g);
        for (auto &x : cs) x = U(g) / 6; for (auto &x : sn) x = U(g) / 6;
        int32_t pos[5] = {0, 3, 9, 2, 7};
        lcu_rope(out.data(), LCU_F32, in.data(), T, nh, d, pos, cs.data(), sn.data(), false, 0);
        bool ok = true;
        for (int t = 0; t < T; t++) for (int h = 0; h < nh; h++) for (int j = 0; j < half; j++) {
            long base = ((long)t * nh + h) * d, p = (long)pos[t] * half + j;
            float x1 = in[base + j], x2 = in[base + j + half], c = cs[p], s_ = sn[p];
            ok &= out[base + j] == x1 * c - x2 * s_ && out[base + j + half] == x2 * c + x1 * s_;
        }
        CHECK(ok, "rope T=%d nh=%d d=%d", T, nh, d);
    }
    /* rmsnorm fwd vs a plain loop */
    {
        int rows = 3, dim = 200;
        std::vector<float> x(rows * dim), y(rows * dim), rs(rows);
        std::vector<__nv_bfloat16> w(dim);
        for (auto &v : x) v = U(g);
        for (auto &v : w) v = __float2bfloat16_rn(U(g) / 6);
        lcu_rmsnorm_fwd(y.data(), LCU_F32, rs.data(), x.data(), (const lcu_bf16 *)w.data(), rows, dim, 1e-6, 0);
        bool ok = true;
        for (int r = 0; r < rows; r++) {
            double ss = 0; for (int i = 0; i < dim; i++) ss += (double)x[r * dim + i] * x[r * dim + i];
            double want = 1.0 / sqrt(ss / dim + 1e-6);
            ok &= fabs(rs[r] - want) < 1e-5 * want;
            for (int i = 0; i < dim; i++) ok &= y[r * dim + i] == x[r * dim + i] * rs[r] * __bfloat162float(w[i]);
        }
        CHECK(ok, "rmsnorm fwd rows=%d dim=%d", rows, dim);
    }
    /* rmsnorm fwd and bwd, bit for bit against a host replica of one warp's order (lane l adds
     * elements l, l + 32, ... in turn, then the butterfly of lcu_warp_sum): the order the
     * first form had and the loads-in-flight form keeps. Row counts on both sides of the
     * one-warp blocks' bound, dims with and without a partial chunk of loads, and a head's
     * 128 (the q/k norm, and the fused decode kernel's share). */
    for (int rows : {3, 40, 2050}) for (int dim : {40, 128, 200, 513, 4096, 4136}) {
        if ((long)rows * dim > 300000) continue;
        long n = (long)rows * dim;
        std::vector<float> x(n), y(n), rs(rows), dy(n), dx(n), dx0(n);
        std::vector<__nv_bfloat16> w(dim);
        for (auto &v : x) v = U(g);
        for (auto &v : dy) v = U(g) / 3;
        for (auto &v : dx0) v = U(g) / 5;
        for (auto &v : w) v = __float2bfloat16_rn(U(g) / 6);
        auto warp_sum = [](float *p) {
            for (int o = 16; o > 0; o >>= 1) {
                float q[32];
                for (int l = 0; l < 32; l++) q[l] = p[l] + p[l ^ o];
                memcpy(p, q, sizeof q);
            }
            return p[0];
        };
        lcu_rmsnorm_fwd(y.data(), LCU_F32, rs.data(), x.data(), (const lcu_bf16 *)w.data(), rows, dim, 1e-6, 0);
        bool okf = true, okb = true, oka = true;
        std::vector<float> want_rs(rows);
        for (int r = 0; r < rows; r++) {
            const float *xr = &x[(long)r * dim];
            float p[32];
            for (int l = 0; l < 32; l++) { p[l] = 0; for (int i = l; i < dim; i += 32) p[l] += xr[i] * xr[i]; }
            float ss = warp_sum(p), want = (float)(1.0 / sqrt((double)ss / dim + 1e-6));
            want_rs[r] = want;
            okf &= rs[r] == want;
            for (int i = 0; i < dim; i++) okf &= y[(long)r * dim + i] == xr[i] * want * __bfloat162float(w[i]);
        }
        CHECK(okf, "rmsnorm fwd rows=%d dim=%d: the warp's order, bit for bit", rows, dim);
        for (int acc = 0; acc < 2; acc++) {
            dx = dx0;
            lcu_rmsnorm_bwd(dx.data(), LCU_F32, dy.data(), LCU_F32, x.data(), rs.data(), (const lcu_bf16 *)w.data(), rows,
                            dim, acc, 0);
            bool &ok = acc ? oka : okb;
            for (int r = 0; r < rows; r++) {
                const float *xr = &x[(long)r * dim], *gr = &dy[(long)r * dim];
                float p[32];
                for (int l = 0; l < 32; l++) {
                    p[l] = 0;
                    for (int i = l; i < dim; i += 32) p[l] += gr[i] * __bfloat162float(w[i]) * xr[i];
                }
                float dot = warp_sum(p), s = want_rs[r], c = (float)((double)dot * s * s / dim);
                for (int i = 0; i < dim; i++) {
                    float v = s * (gr[i] * __bfloat162float(w[i]) - xr[i] * c);
                    if (acc) v += dx0[(long)r * dim + i];
                    ok &= dx[(long)r * dim + i] == v;
                }
            }
        }
        CHECK(okb && oka, "rmsnorm bwd rows=%d dim=%d (written, accumulated): the warp's order, bit for bit", rows, dim);
        std::vector<float> inplace = dy;
        lcu_rmsnorm_bwd(inplace.data(), LCU_F32, inplace.data(), LCU_F32, x.data(), rs.data(),
                        (const lcu_bf16 *)w.data(), rows, dim, false, 0);
        dx = dx0;
        lcu_rmsnorm_bwd(dx.data(), LCU_F32, dy.data(), LCU_F32, x.data(), rs.data(), (const lcu_bf16 *)w.data(), rows,
                        dim, false, 0);
        CHECK(inplace == dx, "rmsnorm bwd rows=%d dim=%d in place (dx = dy)", rows, dim);
    }
    printf("elementwise_emu: %d passed, %d failed\n", checks - fails, fails);
    return fails != 0;
}
