// @brief Fused softmax cross-entropy: loss and d(logits) in one pass, gradient written in place.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/dtype.h"

namespace cutrain::kernels {

// logits: bf16 or fp16 [rows, ld] with the first `vocab` columns real (ld >= vocab; columns past vocab
// are padding: they never win and get gradient 0). labels: int32 [rows]; label == ignore_index
// rows contribute no loss and get gradient 0. Writes, in place over the logits,
//   dlogits = (softmax(logits) - onehot(label)) * grad_scale / n_valid
// where n_valid counts the non-ignored rows, and *loss_mean (device fp32) = mean loss over them.
// `row_loss` (device fp32 [rows], may be null) receives each row's loss (0 for ignored rows).
// A label outside [0, vocab) that is not ignore_index is not read: the row is treated as ignored
// and the first bad row index + 1 goes to *status (device int; may be null).
// When every row is ignored, *loss_mean = 0 and all gradients are 0 (PyTorch would give NaN).
// Deterministic: the mean is summed in a fixed order. Any ld and base alignment (odd ld is fine).
// `scratch`: cross_entropy_scratch_bytes(rows) bytes, 16-byte aligned.
// Two launches: the row kernel overlaps the label count through programmatic dependent launch
// and its last CTA takes the mean. Each row is read from HBM once: a thread-block cluster of
// cross_entropy_ctas_per_row(vocab) CTAs holds it in shared memory, one slice per CTA (rows past
// about 920k columns, more than 8 CTAs can hold on an H100/H200, read the rest of each slice in
// every pass).

// CTAs per row (the cluster size): 1 up to 16384 columns, then one more per 32 KiB of row, at
// most 8. A function of the vocabulary alone, so the bits of the result do not depend on the device.
int cross_entropy_ctas_per_row(int vocab);

std::size_t cross_entropy_scratch_bytes(int rows);
// T: the logits' storage type, bf16 or fp16 (instances of both). `device_grad_scale` (device fp32, may
// be null): multiplied into grad_scale on the device (fp16's loss scale, which a captured CUDA graph
// must read each replay).
template <typename T>
void cross_entropy_forward_backward(cudaStream_t s, T* logits, const int32_t* labels, int rows, int vocab, int ld,
                                    float* loss_mean, float* row_loss, int* status, void* scratch,
                                    int ignore_index = -100, float grad_scale = 1.f,
                                    const float* device_grad_scale = nullptr);

// Forward only (evaluation): the same loss, logits untouched.
template <typename T>
void cross_entropy_forward(cudaStream_t s, const T* logits, const int32_t* labels, int rows, int vocab, int ld,
                           float* loss_mean, float* row_loss, int* status, void* scratch, int ignore_index = -100);

}  // namespace cutrain::kernels
