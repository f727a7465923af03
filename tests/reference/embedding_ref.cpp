#include "tests/reference/embedding_ref.h"

#include <cstddef>

namespace cutrain::ref {

std::vector<double> embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                                      int vocab, int* first_bad) {
  std::vector<double> out(static_cast<std::size_t>(B) * T * C, 0.0);
  if (first_bad) *first_bad = 0;
  for (int i = 0; i < B * T; ++i) {
    const int tok = tokens[i], t = i % T;
    if (tok < 0 || tok >= vocab) {
      if (first_bad && *first_bad == 0) *first_bad = i + 1;
      continue;
    }
    for (int c = 0; c < C; ++c)
      out[static_cast<std::size_t>(i) * C + c] =
          double(wte[static_cast<std::size_t>(tok) * C + c]) + wpe[static_cast<std::size_t>(t) * C + c];
  }
  return out;
}

EmbeddingBackward embedding_backward(const float* dout, const int32_t* tokens, const float* dwte0,
                                     const float* dwpe0, int B, int T, int C, int vocab) {
  EmbeddingBackward g;
  g.dwte.assign(static_cast<std::size_t>(vocab) * C, 0.0);
  g.dwpe.assign(static_cast<std::size_t>(T) * C, 0.0);
  if (dwte0)
    for (std::size_t i = 0; i < g.dwte.size(); ++i) g.dwte[i] = dwte0[i];
  if (dwpe0)
    for (std::size_t i = 0; i < g.dwpe.size(); ++i) g.dwpe[i] = dwpe0[i];
  for (int i = 0; i < B * T; ++i) {
    const int tok = tokens[i], t = i % T;
    const float* d = dout + static_cast<std::size_t>(i) * C;
    for (int c = 0; c < C; ++c) g.dwpe[static_cast<std::size_t>(t) * C + c] += d[c];
    if (tok < 0 || tok >= vocab) continue;
    for (int c = 0; c < C; ++c) g.dwte[static_cast<std::size_t>(tok) * C + c] += d[c];
  }
  return g;
}

}  // namespace cutrain::ref
