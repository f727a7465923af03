#include "train/random_ltd_schedule.h"

#include <algorithm>

#include "runtime/error.h"
#include "train/config_reader.h"

namespace cutrain::train {

std::int64_t random_ltd_kept(const RandomLtdConfig& c, std::int64_t step) {
  CUTRAIN_CHECK(step >= 0 && c.require_steps > 0 && c.seq_per_step > 0 && c.max_value >= c.min_value,
                "random-LTD schedule: step ", step, ", require_steps ", c.require_steps, ", seq_per_step ",
                c.seq_per_step, ", min ", c.min_value, ", max ", c.max_value);
  // Past require_steps + one seq_per_step of growth the value is max_value whatever the step: the
  // clamp keeps the product in range.
  const std::int64_t span = c.max_value - c.min_value;
  const std::int64_t far = c.require_steps + (span > 0 ? (c.seq_per_step * c.require_steps) / span + 1 : 0);
  const std::int64_t s = std::min(step, far);
  const auto grown = static_cast<std::int64_t>((static_cast<__int128>(s) * span) / c.require_steps);
  std::int64_t v = grown + c.min_value;
  v -= v % c.seq_per_step;
  return std::min(v, c.max_value);
}

std::int64_t random_ltd_kept_at(const RandomLtdConfig& c, std::int64_t step, int seq) {
  // DeepSpeed 0.19.8, deepspeed/runtime/data_pipeline/data_routing/basic_layer.py,
  // RandomLayerTokenDrop.forward: reserved_length = scheduler.get_current_seq(), curr_seq = the
  // hidden states' sequence dimension (the curriculum's truncated length), and the layer drops
  // only `if self.training and ... self.reserved_length < self.curr_seq`; otherwise it runs on the
  // whole sequence. So the kept count at length L is the schedule's value when below L, else L.
  return std::min<std::int64_t>(random_ltd_kept(c, step), seq);
}

std::int64_t random_ltd_layer_tokens(const RandomLtdConfig& c, std::int64_t step, std::int64_t sequences,
                                     int num_layers, int seq) {
  const std::int64_t drop = std::int64_t(c.layer_ids.size());
  const std::int64_t kept = random_ltd_kept_at(c, step, seq);
  return sequences * (drop * kept + (num_layers - drop) * seq);
}

void check_random_ltd(const TrainConfig& config, const RandomLtdRun& run) {
  const DataEfficiencyConfig& d = config.data_efficiency;
  if (!d.random_ltd_active()) return;
  const RandomLtdConfig& c = d.random_ltd;
  const std::string p = "data_efficiency.data_routing.random_ltd";
  config_detail::Reader r(config.source.empty() ? std::string("config") : config.source.string(), false, nullptr);
  if (c.total_layer_num != run.num_layers)
    r.fail(p + ".total_layer_num", detail::concat("expected the model's block count ", run.num_layers,
                                                  " (--num_layers), found ", c.total_layer_num));
  for (std::size_t i = 0; i < c.layer_ids.size(); ++i) {
    const int l = c.layer_ids[i];
    if (l >= run.num_layers)
      r.fail(detail::concat(p, ".random_ltd_layer_id[", i, "]"),
             detail::concat("expected a block of the model, in [0, ", run.num_layers, "), found ", l));
    if (std::find(run.moe_layers.begin(), run.moe_layers.end(), l) != run.moe_layers.end())
      r.fail(detail::concat(p, ".random_ltd_layer_id[", i, "]"),
             detail::concat("expected a dense block, found MoE block ", l, " (random-LTD on MoE blocks is not implemented)"));
  }
  if (c.max_value > run.seq)
    r.fail(p + ".random_ltd_schedule.max_value",
           detail::concat("expected at most the sequence length ", run.seq, " (--seq_length), found ", c.max_value));
  if (c.min_value < c.seq_per_step)
    r.fail(p + ".random_ltd_schedule.min_value",
           detail::concat("expected at least seq_per_step ", c.seq_per_step, " (the kept count is rounded down to a "
                          "multiple of it: the first steps would keep no token), found ", c.min_value));
  if (c.model_type == RandomLtdModelType::Decoder && !run.causal)
    r.fail(p + ".model_type", "expected \"encoder\": this model's attention is not causal (the BF16 example's "
                              "synthetic run; --attention causal, --use_real_data's next-token labels and --model gpt2 "
                              "train a causal one), found \"decoder\"");
  if (c.model_type == RandomLtdModelType::Encoder && run.causal)
    r.fail(p + ".model_type", "expected \"decoder\": this model's attention is causal (--attention causal, "
                              "--use_real_data's next-token labels or --model gpt2), found \"encoder\"");
  if (run.pipeline_stages > 1)
    r.fail(p + ".enabled", detail::concat("expected false with pipeline parallelism (", run.pipeline_stages,
                                          " stages): random-LTD under the pipeline is not implemented, found true"));
  if (run.tensor_parallel > 1)
    r.fail(p + ".enabled", detail::concat("expected false with tensor parallelism (degree ", run.tensor_parallel,
                                          "): random-LTD over tensor-parallel blocks is not implemented, found true"));
}

std::string describe_random_ltd(const RandomLtdConfig& c, int seq) {
  std::string ids;
  for (int l : c.layer_ids) ids += (ids.empty() ? "" : ", ") + std::to_string(l);
  return detail::concat("random-LTD: blocks [", ids, "] keep ", c.min_value, "..", c.max_value, " of ", seq,
                        " tokens per sequence over ", c.require_steps, " steps (multiples of ", c.seq_per_step, "), ",
                        name(c.model_type));
}

}  // namespace cutrain::train
