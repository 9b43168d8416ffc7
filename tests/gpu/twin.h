/* twin.h — the CPU backend's kernels (and loss_token) that the gpu tests use as twins,
 * wherever the executor restructuring puts them (gpu/ today; backend/cpu/, executor/
 * after it). */
#ifndef LOOM_TESTS_GPU_TWIN_H
#define LOOM_TESTS_GPU_TWIN_H

#if __has_include("backend/cpu/cpu_ops.h")
#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_pool.h"
#else
#include "gpu/cpu/cpu_attention.h"
#include "gpu/cpu/cpu_ops.h"
#include "gpu/cpu/cpu_pool.h"
#endif

#if __has_include("executor/loss.h")
#include "executor/loss.h"
#else
#include "gpu/loss.h"
#endif

#endif
