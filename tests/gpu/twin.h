/* twin.h — the CPU backend's kernels (and loss_token) that the gpu tests use as twins. */
#ifndef LOOM_TESTS_GPU_TWIN_H
#define LOOM_TESTS_GPU_TWIN_H

#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_pool.h"
#include "backend/loss.h"

#endif
