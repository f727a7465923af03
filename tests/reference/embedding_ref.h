// @brief CPU reference of kernels/embedding, fp64 math.
#pragma once

#include <cstdint>
#include <vector>

namespace cutrain::ref {

// out[b,t,:] = wte[tok,:] + wpe[t,:]; rows of out-of-range tokens are zero. `first_bad` gets the
// first bad flat index + 1 (0 when all valid).
std::vector<double> embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                                      int vocab, int* first_bad);

// dwte [vocab, C] and dwpe [T, C] start from dwte0 / dwpe0 (null: zeros); out-of-range tokens
// contribute nothing.
struct EmbeddingBackward {
  std::vector<double> dwte, dwpe;
};
EmbeddingBackward embedding_backward(const float* dout, const int32_t* tokens, const float* dwte0,
                                     const float* dwpe0, int B, int T, int C, int vocab);

}  // namespace cutrain::ref
