#!/usr/bin/env python3
"""attn_rounding.py — the rounding of lcu_attention.cu emulated in numpy, to set and check
the tolerances of test_gpu_attention.c without a GPU.

Emulated: bf16 inputs, fp32 scores, online softmax over 64-key tiles, P rounded to bf16 for
the PV product with the row sum over the fp32 P, the output rounded to bf16; backward
P = exp(S*scale - lse), D = rowsum(dO * O), dS = P*(dP - D), P and dS rounded to bf16 for
the products. On the test's shapes (the packed batches of d 16/32/64/128, the ~1000-token
sequence, the 32/8-head case) it prints, against fp64, the whole-tensor relative L2 error
and the largest per-(sequence, head) block error with the test's floored denominator
max(|ref_b|, |ref| sqrt(n_b/n)) (tests/gpu/gt.c, gt_block_err).

    python3 tests/gpu/attn_rounding.py [SEED]      (about a minute per seed)

Seeds 1-7 (2026-11-26): whole out 2.0e-3, lse 3.6e-8, dq 2.4e-3, dk 2.2e-3, dv 1.7e-3;
worst block out 2.0e-3, lse 5.1e-8, dq 6.3e-3, dk 4.6e-3, dv 2.0e-3 (bars 1e-2, 1e-5, 2e-2).
"""
import numpy as np, sys
rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 1)

def bf16(x):
    x = np.asarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000
    return u.astype(np.uint32).view(np.float32)

def f32(x): return np.asarray(x, np.float32)

def seq_fwd_bwd(q, k, v, g, scale):
    # one sequence, one head: q,k,v,g [n, d] bf16-exact float32
    n, d = q.shape
    S = f32(q.astype(np.float64) @ k.astype(np.float64).T) * np.float32(scale)
    mask = np.tril(np.ones((n, n), bool))
    S = np.where(mask, S, -np.inf).astype(np.float32)
    m = np.full(n, -np.inf, np.float32); l = np.zeros(n, np.float32); o = np.zeros((n, d), np.float32)
    for t0 in range(0, n, 64):
        St = S[:, t0:t0 + 64]
        mx = St.max(axis=1)
        mn = np.maximum(m, mx)
        ok = mn > -np.inf
        alpha = np.where(ok, np.exp(np.where(ok, m - mn, 0)).astype(np.float32), 1).astype(np.float32)
        P = np.where(ok[:, None], np.exp(St - np.where(ok, mn, 0)[:, None]), 0).astype(np.float32)
        l = f32(l * alpha + P.sum(axis=1, dtype=np.float32))
        o = f32(o * alpha[:, None] + f32(bf16(P).astype(np.float64) @ v[t0:t0 + 64].astype(np.float64)))
        m = np.where(ok, mn, m)
    out = bf16(o / l[:, None]); lse = f32(m + np.log(l))
    # backward
    D = f32((g.astype(np.float64) * out.astype(np.float64)).sum(axis=1))
    P = np.where(mask, np.exp(S - lse[:, None]), 0).astype(np.float32)
    dP = f32(g.astype(np.float64) @ v.astype(np.float64).T)
    dS = f32(P * (dP - D[:, None]))
    dv = f32(bf16(P).T.astype(np.float64) @ g)
    dq = f32(bf16(dS).astype(np.float64) @ k) * np.float32(scale)
    dk = f32(bf16(dS).T.astype(np.float64) @ q) * np.float32(scale)
    return out, lse, dq, dk, dv

def seq_ref(q, k, v, g, scale):
    q, k, v, g = (x.astype(np.float64) for x in (q, k, v, g))
    n = q.shape[0]
    S = q @ k.T * scale
    S[~np.tril(np.ones((n, n), bool))] = -np.inf
    mx = S.max(axis=1, keepdims=True)
    P = np.exp(S - mx); s = P.sum(axis=1, keepdims=True); P /= s
    out = P @ v; lse = (mx + np.log(s))[:, 0]
    D = (g * out).sum(axis=1)
    dP = g @ v.T
    dS = P * (dP - D[:, None])
    return out, lse, dS @ k * scale, dS.T @ q * scale, P.T @ g

def case(lens, nq, nkv, d):
    T = sum(lens); grp = nq // nkv; scale = 1 / np.sqrt(d)
    q = bf16(rng.uniform(-2, 2, (T, nq, d))); k = bf16(rng.uniform(-2, 2, (T, nkv, d)))
    v = bf16(rng.uniform(-1, 1, (T, nkv, d))); g = bf16(rng.uniform(-1, 1, (T, nq, d)))
    got = {n: np.zeros(s) for n, s in [("out", (T, nq, d)), ("lse", (T, nq)), ("dq", (T, nq, d)), ("dk", (T, nkv, d)), ("dv", (T, nkv, d))]}
    ref = {n: np.zeros_like(a) for n, a in got.items()}
    r0 = 0
    for n in lens:
        if n == 0: continue
        sl = slice(r0, r0 + n)
        for h in range(nq):
            kh = h // grp
            a = seq_fwd_bwd(q[sl, h], k[sl, kh], v[sl, kh], g[sl, h], scale)
            b = seq_ref(q[sl, h], k[sl, kh], v[sl, kh], g[sl, h], scale)
            for name, x, y in zip(("out", "lse", "dq"), a, b):
                got[name][sl, h] = x; ref[name][sl, h] = y
            for name, x, y in zip(("dk", "dv"), a[3:], b[3:]):
                got[name][sl, kh] += x; ref[name][sl, kh] += y
        r0 += n
    res = {}
    for name in got:
        G, R = got[name], ref[name]
        whole = np.linalg.norm(G - R) / np.linalg.norm(R)
        N = R.size; worst = 0
        r0 = 0
        for n in lens:
            if n == 0: continue
            for h in range(R.shape[1]):
                Gb, Rb = G[r0:r0 + n, h], R[r0:r0 + n, h]
                den = max(np.linalg.norm(Rb), np.linalg.norm(R) * np.sqrt(Rb.size / N))
                worst = max(worst, np.linalg.norm(Gb - Rb) / den)
            r0 += n
        res[name] = (whole, worst)
    return res

cases = []
dims = [16, 32, 64, 128]; heads = [(4, 2), (4, 4), (8, 2), (16, 8)]
for di in range(4):
    cases.append(([1, 64, 65, int(rng.integers(2, 64)), 0, int(rng.integers(66, 201)), int(rng.integers(1, 131))], *heads[di], dims[di]))
cases.append(([int(rng.integers(900, 1101))], 8, 2, 64))
cases.append(([int(rng.integers(1, 301)) for _ in range(3)], 32, 8, 128))
agg = {}
for lens, nq, nkv, d in cases:
    r = case(lens, nq, nkv, d)
    print(f"lens {lens} nq {nq} nkv {nkv} d {d}: " + "  ".join(f"{n} {w:.2e}/{b:.2e}" for n, (w, b) in r.items()), flush=True)
    for n, (w, b) in r.items():
        aw, ab = agg.get(n, (0, 0)); agg[n] = (max(aw, w), max(ab, b))
print("max over cases (whole / worst block):", "  ".join(f"{n} {w:.2e}/{b:.2e}" for n, (w, b) in agg.items()))
