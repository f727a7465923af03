#include "tests/reference/token_drop_ref.h"

#include "runtime/error.h"

namespace cutrain::ref {

std::vector<double> token_gather(const std::vector<double>& x, const std::vector<std::int32_t>& idx, int B, int S,
                                 int K, int h) {
  CUTRAIN_CHECK(x.size() == std::size_t(B) * S * h && idx.size() == std::size_t(B) * K, "token_gather ref: sizes");
  std::vector<double> kept(std::size_t(B) * K * h);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < K; ++j) {
      const int p = idx[std::size_t(b) * K + j];
      CUTRAIN_CHECK(p >= 0 && p < S, "token_gather ref: index ", p, " outside [0, ", S, ")");
      for (int c = 0; c < h; ++c)
        kept[(std::size_t(b) * K + j) * h + c] = x[(std::size_t(b) * S + p) * h + c];
    }
  return kept;
}

void token_scatter(const std::vector<double>& kept, const std::vector<double>* add, const std::vector<std::int32_t>& idx,
                   std::vector<double>& out, int B, int S, int K, int h) {
  CUTRAIN_CHECK(out.size() == std::size_t(B) * S * h && kept.size() == std::size_t(B) * K * h &&
                    (!add || add->size() == kept.size()) && idx.size() == std::size_t(B) * K,
                "token_scatter ref: sizes");
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < K; ++j) {
      const int p = idx[std::size_t(b) * K + j];
      CUTRAIN_CHECK(p >= 0 && p < S, "token_scatter ref: index ", p, " outside [0, ", S, ")");
      for (int c = 0; c < h; ++c) {
        const std::size_t k = (std::size_t(b) * K + j) * h + c;
        out[(std::size_t(b) * S + p) * h + c] = kept[k] + (add ? (*add)[k] : 0.0);
      }
    }
}

std::vector<double> token_merge(const std::vector<double>& x, const std::vector<double>& kept,
                                const std::vector<double>* add, const std::vector<std::int32_t>& idx, int B, int S,
                                int K, int h) {
  CUTRAIN_CHECK(x.size() == std::size_t(B) * S * h, "token_merge ref: sizes");
  std::vector<double> out = x;
  token_scatter(kept, add, idx, out, B, S, K, h);
  return out;
}

}  // namespace cutrain::ref
