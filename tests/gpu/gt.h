/* gt.h — the harness of the gpu tests (tests/gpu/test_gpu_*.c): skip without a device
 * (exit 77), fresh random inputs from a printed seed (GT_SEED=... repeats a run), device
 * buffers poisoned with NaN bytes (an unwritten element fails every comparison), relative
 * L2 errors against fp64 references, bitwise comparisons for determinism, and a
 * "N passed, N failed" summary like the other C tests.
 */
#ifndef LOOM_TESTS_GPU_GT_H
#define LOOM_TESTS_GPU_GT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_ops.h"
#include "model/rng.h"

extern int gt_passed, gt_failed;
extern rng_state gt_rng;

/* Exits 77 (ctest: skipped) when no CUDA device is usable; else prints the device and the
 * seed, seeds gt_rng. */
void gt_init(const char *name);
/* GT_SMALL set: the tests skip their largest shapes (runs under compute-sanitizer). */
bool gt_small(void);
/* Prints the summary; the exit status for main. */
int gt_finish(void);

/* A CUDA runtime call or an lcu_* call that must succeed: prints and exits 1 otherwise. */
#define GT_CUDA(call) gt_cuda_ok((int)(call), #call, __FILE__, __LINE__)
#define GT_LCU(call) gt_lcu_ok((call), #call, __FILE__, __LINE__)
void gt_cuda_ok(int rc, const char *what, const char *file, int line);
void gt_lcu_ok(int rc, const char *what, const char *file, int line);

/* Records one check: prints FAIL lines (and PASS lines when GT_VERBOSE is set). */
bool gt_check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- random inputs -------------------------------------------------------------------- */
double gt_uniform(double lo, double hi);
int gt_int(int lo, int hi); /* inclusive */
void gt_fill(float *x, size_t n, double lo, double hi);
/* Fills with uniform values already rounded to bf16, so fp32 and bf16 copies agree. */
void gt_fill_bf16_exact(float *x, size_t n, double lo, double hi);

/* ---- bf16 on the host ---------------------------------------------------------------- */
uint16_t gt_f2bf(float f); /* round to nearest even, as __float2bfloat16_rn */
float gt_bf2f(uint16_t b);
float gt_round_bf16(float f);

/* ---- device buffers ------------------------------------------------------------------ */
/* cudaMalloc of bytes, filled with 0xFF bytes (NaN in fp32 and bf16). */
void *gt_dev_poison(size_t bytes);
/* Device copies of host arrays (fp32 as is, or converted to bf16). */
void *gt_dev_f32(const float *h, size_t n);
void *gt_dev_bf16(const float *h, size_t n);
void *gt_dev_copy(const void *h, size_t bytes);
/* n values uniform in [lo, hi] on the device as F32 or BF16, fast enough for GBs: a pool of
 * 4M random values (drawn once) tiled with shifts. For benchmarks, not for checks. */
void *gt_dev_random(size_t n, lcu_dtype t, double lo, double hi);
/* Every buffer gt_dev_poison (and so gt_dev_copy, _f32, _bf16, _random) hands out is listed:
 * gt_dev_release(m) frees those handed out since m = gt_dev_mark(), for a benchmark that
 * sets up one configuration after another. (cudaDeviceReset instead leaves cuBLAS unable
 * to create a handle in the fresh context: "the library was not initialized".) */
size_t gt_dev_mark(void);
void gt_dev_release(size_t mark);
/* Host copies of device arrays (bf16 converted to fp32). */
void gt_get_f32(float *h, const void *d, size_t n);
void gt_get_bf16(float *h, const void *d, size_t n);
void gt_get(void *h, const void *d, size_t bytes);
void gt_free(void *d);

/* ---- comparisons --------------------------------------------------------------------- */
/* ‖out − ref‖₂ / ‖ref‖₂ (with ‖ref‖ floored at 1e-30); +inf when out holds a NaN or inf
 * (an unwritten, poisoned element included). */
double gt_rel_err(const float *out, const double *ref, size_t n);
double gt_rel_err_f(const float *out, const float *ref, size_t n);
/* Largest |out − ref| (inf on NaN). */
double gt_max_abs_err(const float *out, const double *ref, size_t n);
/* Index of the largest |out − ref| (a NaN counts as largest). */
size_t gt_worst(const float *out, const double *ref, size_t n);
/* Checks rel_err ≤ tol and prints the figure either way (on failure also the worst
 * element, or the first non-finite one and how many there are). */
bool gt_expect_close(const char *what, const float *out, const double *ref, size_t n, double tol);
bool gt_expect_bits(const char *what, const void *a, const void *b, size_t bytes);

/* Per-block errors, so that one wrong row cannot hide in a whole-tensor norm: the elements
 * of a tensor fall into blocks (block_of(i, arg) in [0, nblocks), or −1 for none: e.g. the
 * rows of one sequence and head, or one row of logits), and block b's error is
 *   ‖out_b − ref_b‖ / max(‖ref_b‖, ‖ref‖·√(n_b / n))
 * (a block whose reference is far below the tensor's typical size is measured against
 * that size, so that rounding on near-zero values does not count as relative error).
 * Returns the largest, +inf when out holds a NaN or inf; *worst = its block. */
typedef long (*gt_block_fn)(size_t i, const void *arg);
double gt_block_err(const float *out, const double *ref, size_t n, long nblocks, gt_block_fn block_of,
                    const void *arg, long *worst);
/* Checks gt_block_err ≤ tol and prints the figure; *worst (may be NULL) = the worst block,
 * for the caller to say where it is. */
bool gt_expect_blocks(const char *what, const char *unit, const float *out, const double *ref, size_t n, long nblocks,
                      gt_block_fn block_of, const void *arg, double tol, long *worst);
/* Blocks that are consecutive runs of `per` elements (rows of a matrix, or per = 1). */
long gt_block_run(size_t i, const void *per);

#endif
