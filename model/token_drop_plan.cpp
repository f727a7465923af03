#include "model/token_drop_plan.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "runtime/error.h"

namespace cutrain::model {
namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

int TokenDropPlan::slot(int layer) const {
  if (!active()) return -1;
  const auto it = std::lower_bound(layers.begin(), layers.end(), layer);
  return it != layers.end() && *it == layer ? int(it - layers.begin()) : -1;
}

std::int64_t TokenDropPlan::layer_tokens(int num_layers) const {
  const std::int64_t drop = active() ? std::int64_t(layers.size()) : 0;
  return std::int64_t(batch) * (drop * kept + (num_layers - drop) * seq);
}

void draw_token_drop(TokenDropPlan& plan, std::uint64_t seed, std::int64_t step, int micro, int first_seq, int B,
                     int S, int K, std::vector<int> layers) {
  CUTRAIN_CHECK(B > 0 && S > 0 && K > 0, "random-LTD: batch, seq and kept tokens must be positive, got B=", B, " S=",
                S, " K=", K);
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  plan.batch = B;
  plan.seq = S;
  plan.kept = std::min(K, S);
  plan.layers = std::move(layers);
  plan.indices.clear();
  if (!plan.active()) return;
  plan.indices.resize(plan.layers.size() * std::size_t(B) * K);
  std::vector<std::int32_t> pos(static_cast<std::size_t>(S));
  std::vector<std::uint8_t> chosen(static_cast<std::size_t>(S));
  for (std::size_t k = 0; k < plan.layers.size(); ++k)
    for (int b = 0; b < B; ++b) {
      std::uint64_t h = mix(seed);
      for (std::uint64_t v : {std::uint64_t(step), std::uint64_t(micro), std::uint64_t(plan.layers[k]),
                              std::uint64_t(first_seq + b)})
        h = mix(h ^ v);
      std::mt19937_64 rng(h);
      std::iota(pos.begin(), pos.end(), 0);
      for (int i = 0; i < K; ++i) {  // partial Fisher-Yates: pos[0, K) is a uniform K-subset
        const int j = i + int(rng() % std::uint64_t(S - i));
        std::swap(pos[std::size_t(i)], pos[std::size_t(j)]);
      }
      // The chosen positions in ascending order: a scan of S flags instead of sorting K values
      // (the same set; O(S) where the sort was O(K log K), the host work of every step).
      std::int32_t* out = plan.indices.data() + (k * B + std::size_t(b)) * K;
      std::fill(chosen.begin(), chosen.end(), std::uint8_t(0));
      for (int i = 0; i < K; ++i) chosen[std::size_t(pos[std::size_t(i)])] = 1;
      for (int p = 0; p < S; ++p)
        if (chosen[std::size_t(p)]) *out++ = p;
    }
}

}  // namespace cutrain::model
