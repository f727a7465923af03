// Attention family: the run-time choice of kernel variant (for benchmarking the tile shapes side
// by side in one process; the default is the one measured fastest among the correct ones).
#include <atomic>
#include <cstdlib>
#include <sstream>

#include "kernels/attention.cuh"
#include "kernels/attention_tiles.cuh"
#include "runtime/error.h"

namespace cutrain::kernels {
namespace {

constexpr const char* kNames[] = {"v1", "v2_m128", "v2_m128n32", "v2_m128w8", "v2_m128k32"};  // attn::Variant's order
constexpr int kCount = static_cast<int>(sizeof(kNames) / sizeof(kNames[0]));
// The default variant: the fastest one that passed every GPU test on the device (one line to change).
// v2_m128 won forward+backward at the BF16 example's shape (B4 H16 S512 D64, non-causal) on the H200
// on 2026-12-02: 111.0 us against v1's 121.9 (docs/perf-notes.md, attention).
constexpr attn::Variant kDefault = attn::Variant::V2_M128;
std::atomic<int> g_variant{-1};  // -1: not chosen yet (the environment decides at first use)

int index_of(const std::string& name, const char* where) {
  if (name.empty()) return static_cast<int>(kDefault);
  for (int i = 0; i < kCount; ++i)
    if (name == kNames[i]) return i;
  std::ostringstream known;  // the default first, as attention_variant_names() lists them
  const std::vector<std::string> names = attention_variant_names();
  for (std::size_t i = 0; i < names.size(); ++i) known << (i ? ", " : "") << names[i];
  CUTRAIN_FAIL(where, ": unknown attention variant '", name, "', expected one of: ", known.str());
}

}  // namespace

std::vector<std::string> attention_variant_names() {
  std::vector<std::string> names{kNames[static_cast<int>(kDefault)]};
  for (int i = 0; i < kCount; ++i)
    if (i != static_cast<int>(kDefault)) names.emplace_back(kNames[i]);
  return names;
}

void attention_set_variant(const std::string& name) { g_variant.store(index_of(name, "attention_set_variant")); }

std::string attention_variant() { return kNames[static_cast<int>(attn::current_variant())]; }

attn::Variant attn::current_variant() {
  int v = g_variant.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("CUTRAIN_ATTN_VARIANT");
    int expected = -1;
    g_variant.compare_exchange_strong(expected, index_of(env ? env : "", "CUTRAIN_ATTN_VARIANT"));
    v = g_variant.load();
  }
  return static_cast<Variant>(v);
}

}  // namespace cutrain::kernels
