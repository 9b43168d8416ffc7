/* decode_attn_emu.cpp — lcu_attn_decode_fwd (backend/cuda/lcu_attention_decode.cu) through the
 * CPU emulation of include/emu.h against an fp64 reference, on small shapes: one query row a
 * sequence (a decode step), several rows (the general q_len ≤ kv_len), every head size,
 * groups of 1 to 12 query heads (two chunks of the kernel's tasks). Built and run by
 * run_emu.sh decode-attn; a development check of the kernel's index logic before a GPU
 * window, not a GPU pass (test_gpu_attention is). */
#include "emu.h"
#include "backend/cuda/cuda_ops.h"
#include <random>
#include <vector>

static float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
static int fails, checks;

static void run(int nseq, int nq, int nkv, int d, bool decode, std::mt19937 &g)
{
    std::uniform_real_distribution<float> U(-2, 2);
    std::vector<int32_t> qs(nseq + 1), kl(nseq);
    std::vector<int64_t> ks(nseq + 1);
    long row = 0;
    qs[0] = 0;
    for (int i = 0; i < nseq; i++) {
        int L = 1 + (int)(g() % 40), ql = decode ? 1 : 1 + (int)(g() % (L < 5 ? L : 5));
        kl[i] = L;
        row += g() % 50; /* a gap before the sequence's cache rows */
        ks[i] = row;
        row += L;
        qs[i + 1] = qs[i] + ql;
    }
    long T = qs[nseq], KR = row + 3;
    std::vector<float> q(T * nq * d), k(KR * nkv * d), v(KR * nkv * d), lse(T * nq, NAN);
    for (auto &x : q) x = round_bf16(U(g));
    for (auto &x : k) x = round_bf16(U(g));
    for (auto &x : v) x = round_bf16(U(g) / 2);
    std::vector<__nv_bfloat16> qb(q.size()), kb(k.size()), vb(v.size()), ob(T * nq * d);
    for (size_t i = 0; i < q.size(); i++) qb[i] = __float2bfloat16_rn(q[i]);
    for (size_t i = 0; i < k.size(); i++) kb[i] = __float2bfloat16_rn(k[i]);
    for (size_t i = 0; i < v.size(); i++) vb[i] = __float2bfloat16_rn(v[i]);
    for (auto &x : ob) x.__x = 0xffff; /* NaN: every output must be written */
    lcu_attn_desc a = {nseq, qs.data(), ks.data(), kl.data(), T, nq, nkv, d, (float)(1.0 / sqrt((double)d)), false};
    int rc = lcu_attn_decode_fwd(&a, (const lcu_bf16 *)qb.data(), (const lcu_bf16 *)kb.data(),
                                 (const lcu_bf16 *)vb.data(), (lcu_bf16 *)ob.data(), lse.data(), 0);
    checks++;
    if (rc) {
        printf("FAIL rc %d\n", rc);
        fails++;
        return;
    }
    double worst = 0, worst_lse = 0;
    int G = nq / nkv;
    for (int i = 0; i < nseq; i++) {
        int ql = qs[i + 1] - qs[i];
        for (int r = 0; r < ql; r++)
            for (int h = 0; h < nq; h++) {
                long qr = qs[i] + r;
                int lim = kl[i] - ql + r + 1, kh = h / G;
                std::vector<double> s(lim);
                double m = -1e300, L = 0;
                for (int j = 0; j < lim; j++) {
                    double t = 0;
                    for (int c = 0; c < d; c++) t += (double)q[(qr * nq + h) * d + c] * k[((ks[i] + j) * nkv + kh) * d + c];
                    s[j] = t / sqrt((double)d);
                    m = s[j] > m ? s[j] : m;
                }
                for (int j = 0; j < lim; j++) L += exp(s[j] - m);
                for (int c = 0; c < d; c++) {
                    double o = 0;
                    for (int j = 0; j < lim; j++) o += exp(s[j] - m) / L * v[((ks[i] + j) * nkv + kh) * d + c];
                    double got = __bfloat162float(ob[(qr * nq + h) * d + c]), e = fabs(got - o) / (fabs(o) + 1e-2);
                    if (!(e <= worst)) worst = e;
                }
                double el = fabs(lse[qr * nq + h] - (m + log(L)));
                if (!(el <= worst_lse)) worst_lse = el;
            }
    }
    bool ok = worst < 1e-2 && worst_lse < 1e-4;
    fails += !ok;
    printf("%s nseq=%d nq=%d nkv=%d d=%d %s T=%ld: out rel err %.2e, lse abs err %.2e\n", ok ? "ok  " : "FAIL", nseq,
           nq, nkv, d, decode ? "decode" : "q_len>1", T, worst, worst_lse);
    fflush(stdout);
}

int main()
{
    std::mt19937 g(20261127);
    const int dims[4] = {16, 32, 64, 128}, heads[4][2] = {{4, 2}, {8, 8}, {16, 8}, {32, 8}};
    for (int di = 0; di < 4; di++) {
        run(3, heads[di][0], heads[di][1], dims[di], true, g);
        run(2, heads[di][0], heads[di][1], dims[di], false, g);
    }
    run(2, 24, 2, 64, true, g); /* 12 heads a group: two chunks of tasks */
    run(2, 6, 1, 32, false, g);
    printf("decode_attn_emu: %d passed, %d failed\n", checks - fails, fails);
    return fails != 0;
}
