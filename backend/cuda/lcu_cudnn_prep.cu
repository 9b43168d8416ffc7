/* lcu_cudnn_prep.cu — the packed batch as cuDNN's graphs read it (lcd_ragged_prep in
 * lcu_cudnn.h): per-sequence lengths and the ragged offsets, in elements, of the tensors
 * whose rows are the packed tokens. One small kernel on the caller's stream, so the
 * descriptor's device q_start never goes through the host. */
#include "backend/cuda/lcu_common.cuh"
#include "backend/cuda/lcu_cudnn.h"

__global__ void lcd_ragged_prep_k(const int32_t *q_start, int nseq, int B, int64_t mul_qo, int64_t mul_kv,
                                  int64_t mul_st, int32_t *seq_len, int64_t *ro_qo, int64_t *ro_kv, int64_t *ro_st)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i <= B; i += gridDim.x * blockDim.x) {
        /* entries past nseq: empty sequences at the end of the batch (the bucket's padding) */
        int64_t r = q_start[i < nseq ? i : nseq];
        ro_qo[i] = r * mul_qo;
        ro_kv[i] = r * mul_kv;
        ro_st[i] = r * mul_st;
        if (i < B) seq_len[i] = i < nseq ? q_start[i + 1] - q_start[i] : 0;
    }
}

int lcd_ragged_prep(const int32_t *q_start, int nseq, int B, int64_t mul_qo, int64_t mul_kv, int64_t mul_st,
                    int32_t *seq_len, int64_t *ro_qo, int64_t *ro_kv, int64_t *ro_st, cudaStream_t s)
{
    if (!q_start || nseq < 0 || B < nseq || !seq_len || !ro_qo || !ro_kv || !ro_st) return LCU_EINVAL;
    lcd_ragged_prep_k<<<lcu_blocks(B + 1, 256), 256, 0, s>>>(q_start, nseq, B, mul_qo, mul_kv, mul_st, seq_len, ro_qo,
                                                              ro_kv, ro_st);
    return lcu_launch_status();
}
