/* emu.cpp — the emulated launch, barriers, shuffles, WMMA stores and runtime calls of
 * include/emu.h and include/emu_rt.h. */
#include "emu.h"
#include <vector>
thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;
static pthread_barrier_t g_block_bar;
static pthread_barrier_t g_warp_bar[32];
static float g_slots[32][32];
void __syncthreads() { pthread_barrier_wait(&g_block_bar); }
float emu_shfl_xor(float v, int o)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    g_slots[w][lane] = v;
    pthread_barrier_wait(&g_warp_bar[w]);
    float r = g_slots[w][lane ^ o];
    pthread_barrier_wait(&g_warp_bar[w]);
    return r;
}
namespace nvcuda { namespace wmma {
void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ld, layout_t l)
{
    if (((uintptr_t)p) % 32) { fprintf(stderr, "EMU: wmma store pointer not 32-byte aligned\n"); abort(); }
    if ((threadIdx.x & 31) != 0) return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) (l == mem_row_major ? p[r * ld + c] : p[r + c * ld]) = f.x[r][c];
}
}}
struct targ { emu_launch_ctx *c; unsigned tid; };
static void *thread_main(void *p)
{
    targ *a = (targ *)p;
    emu_launch_ctx *c = a->c;
    threadIdx = uint3{a->tid, 0, 0};
    blockDim = c->block;
    gridDim = c->grid;
    for (unsigned by = 0; by < c->grid.y; by++)
        for (unsigned bx = 0; bx < c->grid.x; bx++) {
            blockIdx = uint3{bx, by, 0};
            c->run(c->arg);
            pthread_barrier_wait(&g_block_bar); /* the block's shared memory is free again */
        }
    return NULL;
}
void emu_run(emu_launch_ctx *c)
{
    unsigned n = c->block.x;
    if (n % 32 || n > 1024) { fprintf(stderr, "EMU: block of %u\n", n); abort(); }
    pthread_barrier_init(&g_block_bar, NULL, n);
    for (unsigned w = 0; w < n / 32; w++) pthread_barrier_init(&g_warp_bar[w], NULL, 32);
    std::vector<pthread_t> th(n);
    std::vector<targ> args(n);
    for (unsigned i = 0; i < n; i++) {
        args[i] = targ{c, i};
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setstacksize(&at, 256 << 10);
        if (pthread_create(&th[i], &at, thread_main, &args[i])) { fprintf(stderr, "EMU: pthread_create\n"); abort(); }
        pthread_attr_destroy(&at);
    }
    for (unsigned i = 0; i < n; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&g_block_bar);
    for (unsigned w = 0; w < n / 32; w++) pthread_barrier_destroy(&g_warp_bar[w]);
}
extern "C" {
cudaError_t cudaGetLastError(void) { return 0; }
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return 0; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int) { memset(p, 0, sizeof *p); strcpy(p->name, "CPU emulation"); p->major = 9; p->multiProcessorCount = 1; p->totalGlobalMem = 1ul << 34; return 0; }
cudaError_t cudaSetDevice(int) { return 0; }
cudaError_t cudaDeviceSynchronize(void) { return 0; }
cudaError_t cudaMalloc(void **p, size_t n) { *p = aligned_alloc(256, (n + 255) / 256 * 256); return *p ? 0 : 2; }
cudaError_t cudaFree(void *p) { free(p); return 0; }
cudaError_t cudaMemset(void *p, int v, size_t n) { memset(p, v, n); return 0; }
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) { memcpy(d, s, n); return 0; }
cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h, cudaMemcpyKind, cudaStream_t)
{
    for (size_t r = 0; r < h; r++) memcpy((char *)d + r * dp, (const char *)s + r * sp, w);
    return 0;
}
const char *cudaGetErrorString(cudaError_t e) { return e ? "emulated error" : "no error"; }
}
