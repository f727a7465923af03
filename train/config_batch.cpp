// TrainConfig::resolve_batch: DeepSpeed's rule, train_batch_size = micro * accumulation * world size,
// any two (or the micro batch or train batch alone) determining the rest.
#include <limits>
#include <string>
#include <utility>

#include "train/config.h"

namespace cutrain::train {

namespace {
[[noreturn]] void batch_error(const TrainConfig& c, const std::string& why) {
  std::string origin = c.source.empty() ? std::string("config") : c.source.string();
  throw ConfigError(detail::concat(origin, ": batch sizes: ", why), __FILE__, __LINE__);
}
}  // namespace

void TrainConfig::resolve_batch(int world_size) {
  if (world_size < 1) batch_error(*this, detail::concat("expected a world size >= 1, found ", world_size));
  if (!batch_given) batch_given = BatchGiven{train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps};
  const auto& g = *batch_given;
  for (auto [v, name] : {std::pair{g.train, "train_batch_size"}, std::pair{g.micro, "train_micro_batch_size_per_gpu"},
                         std::pair{g.accumulation, "gradient_accumulation_steps"}})
    if (v && *v < 1) batch_error(*this, detail::concat(name, ": expected a positive integer, found ", *v));

  const long long w = world_size;
  long long train = 0, micro = 0, accum = 0;
  // train_batch_size and one factor (`given`, value `per`) given: the other factor, `missing`.
  const auto other_factor = [&](long long per, const char* given, const char* missing) {
    if (train % (per * w) != 0)
      batch_error(*this, detail::concat("train_batch_size ", train, " is not a multiple of ", given, " ", per,
                                        " * world size ", w, " = ", per * w, ", so no whole ", missing, " fits"));
    return train / (per * w);
  };
  if (g.train && g.micro && g.accumulation) {
    train = *g.train, micro = *g.micro, accum = *g.accumulation;
  } else if (g.train && g.micro) {
    train = *g.train, micro = *g.micro;
    accum = other_factor(micro, "train_micro_batch_size_per_gpu", "gradient_accumulation_steps");
  } else if (g.train && g.accumulation) {
    train = *g.train, accum = *g.accumulation;
    micro = other_factor(accum, "gradient_accumulation_steps", "train_micro_batch_size_per_gpu");
  } else if (g.micro && g.accumulation) {
    micro = *g.micro, accum = *g.accumulation, train = micro * accum * w;
  } else if (g.train) {
    train = *g.train, accum = 1;
    if (train % w != 0)
      batch_error(*this, detail::concat("train_batch_size ", train, " is not a multiple of the world size ", w,
                                        " (with gradient_accumulation_steps 1)"));
    micro = train / w;
  } else if (g.micro) {
    micro = *g.micro, accum = 1, train = micro * w;
  } else {
    batch_error(*this, "expected train_batch_size or train_micro_batch_size_per_gpu (or both), found neither");
  }
  if (train != micro * accum * w)
    batch_error(*this, detail::concat("train_batch_size ", train, " != train_micro_batch_size_per_gpu ", micro,
                                      " * gradient_accumulation_steps ", accum, " * world size ", w, " = ",
                                      micro * accum * w));
  if (train > std::numeric_limits<int>::max())
    batch_error(*this, detail::concat("train_batch_size ", train, " does not fit an int"));
  train_batch_size = static_cast<int>(train);
  train_micro_batch_size_per_gpu = static_cast<int>(micro);
  gradient_accumulation_steps = static_cast<int>(accum);
}

}  // namespace cutrain::train
