#include "trainer.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/offload.h"
#include "tensor_arg.h"
#include "train/config.h"
#include "train/cpu_backend.h"
#include "train/engine.h"
#include "train/lr_schedule.h"
#include "train/precision.h"
#include "train/random_ltd_schedule.h"

namespace cutrain::python {

namespace nb = nanobind;
using namespace nb::literals;

namespace {

class PyTrainer {
 public:
  PyTrainer(const std::string& config, const std::string& device, int hidden_dim, int num_layers, int num_heads,
            int vocab_size, int batch_size, int seq_length, std::uint64_t seed, bool activation_checkpointing,
            bool cuda_graph, bool causal, const std::string& model)
      : cfg_(train::load_config(config)) {
    const train::TrainDevice dev = train::parse_choice(train::kTrainDevices, device, "device");
    if (!cfg_.train_micro_batch_size_per_gpu) cfg_.train_micro_batch_size_per_gpu = batch_size;
    cfg_.resolve_batch(1);
    accum_ = cfg_.accumulation();
    schedule_ = std::make_unique<train::LrSchedule>(train::LrSchedule::from_config(cfg_));
    train::BackendOptions bo;
    bo.dims = model::ModelDims{hidden_dim, num_layers, num_heads, vocab_size, seq_length};
    bo.dims.arch = train::parse_choice(train::kModelArchs, model, "model");
    bo.batch = batch_size;
    bo.seq = seq_length;
    bo.seed = seed;
    bo.activation_checkpointing = activation_checkpointing;
    bo.cuda_graph = cuda_graph;
    bo.causal = causal;
    bo.deterministic_attention = cfg_.attention_backward == train::AttentionBackward::Deterministic;
    bo.dims.validate();
    // random-LTD's config against this model, as cutrain train checks it.
    train::check_random_ltd(cfg_, {num_layers, seq_length, causal || bo.dims.arch == model::Arch::Gpt2, {}, 1});
    tokens_per_step_ = static_cast<std::size_t>(accum_) * batch_size * seq_length;
    tokens_per_batch_ = static_cast<std::size_t>(batch_size) * seq_length;
    vocab_ = vocab_size;
    nb::gil_scoped_release r;
    be_ = dev == train::TrainDevice::Cpu ? train::make_cpu_backend(bo, cfg_) : train::make_gpu_backend(bo, cfg_);
    gpu_ = dynamic_cast<train::GpuEngine*>(be_.get());
  }

  // One optimizer step on [accumulation, batch, seq] tokens and labels; lr from the config's
  // schedule at this step unless given.
  nb::dict step(nb::handle tokens, nb::handle labels, nb::object lr) {
    const std::int32_t* t = ids(tokens, "tokens", tokens_per_step_);
    const std::int32_t* l = ids(labels, "labels", tokens_per_step_);
    const float rate = lr.is_none() ? schedule_->lr(steps_) : nb::cast<float>(lr);
    train::StepStats s;
    {
      nb::gil_scoped_release r;
      s = be_->step(t, l, steps_ + 1, rate);
    }
    ++steps_;
    nb::dict d;
    d["loss"] = s.loss;
    d["grad_norm"] = s.grad_norm;
    d["skipped"] = s.skipped;
    d["lr"] = rate;
    d["step"] = steps_;
    d["layer_tokens"] = s.layer_tokens;  // this process's blocks' tokens (random-LTD's count)
    return d;
  }
  double eval_loss(nb::handle tokens, nb::handle labels) {
    const std::int32_t* t = ids(tokens, "tokens", tokens_per_batch_);
    const std::int32_t* l = ids(labels, "labels", tokens_per_batch_);
    nb::gil_scoped_release r;
    return be_->eval_loss(t, l);
  }
  nb::dict memory() const {
    const train::MemoryStats m = be_->memory();
    nb::dict d;
    d["allocated"] = m.allocated;
    d["reserved"] = m.reserved;
    d["peak"] = m.peak;
    return d;
  }
  void offload_states(nb::object include, const std::string& device, bool pin_memory, bool non_blocking,
                      const std::string& nvme_path) {
    train::GpuEngine& g = engine("offload_states");
    std::vector<std::string> names;
    if (!include.is_none()) names = nb::cast<std::vector<std::string>>(include);
    const OffloadDevice d = parse_offload_device(device);
    nb::gil_scoped_release r;
    g.offload_states(names, d, pin_memory, non_blocking, nvme_path);
  }
  void reload_states(bool non_blocking) {
    train::GpuEngine& g = engine("reload_states");
    nb::gil_scoped_release r;
    g.reload_states(non_blocking);
  }
  std::vector<std::string> offloadable_states() { return engine("offloadable_states").offloadable_states(); }
  int steps() const { return steps_; }
  std::string describe() const { return be_->describe(); }

 private:
  train::GpuEngine& engine(const char* op) {
    CUTRAIN_CHECK(gpu_ != nullptr, "Trainer.", op, ": the training state is offloaded by the GPU engine; this trainer ",
                  "runs on ", be_->describe(), " (device='cuda')");
    return *gpu_;
  }
  // Host int32 ids of exactly `n` elements, each in [0, vocab).
  const std::int32_t* ids(nb::handle obj, const char* what, std::size_t n) {
    const std::string op = std::string("Trainer: ") + what;
    TensorArg t = tensor_arg(obj, op.c_str(), what, false);
    const nb::dlpack::dtype dt = tensor_dtype(obj, op.c_str(), what);
    if (dt.code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) || dt.bits != 32 || t.device)
      throw nb::type_error((op + " must be a host int32 tensor").c_str());
    if (t.bytes != n * 4)
      throw nb::value_error((op + " holds " + std::to_string(t.bytes / 4) + " ids, expected " + std::to_string(n) +
                             " (accumulation x batch_size x seq_length for step, batch_size x seq_length for eval_loss)")
                                .c_str());
    const auto* p = static_cast<const std::int32_t*>(t.data);
    for (std::size_t i = 0; i < n; ++i)
      if (p[i] < 0 || p[i] >= vocab_)
        throw nb::value_error((op + "[" + std::to_string(i) + "] is " + std::to_string(p[i]) + ", outside [0, " +
                               std::to_string(vocab_) + ")")
                                  .c_str());
    return p;  // the caller's tensor outlives the call that uses it
  }

  train::TrainConfig cfg_;
  std::unique_ptr<train::LrSchedule> schedule_;
  std::unique_ptr<train::TrainBackend> be_;
  train::GpuEngine* gpu_ = nullptr;
  int accum_ = 1, steps_ = 0, vocab_ = 0;
  std::size_t tokens_per_step_ = 0, tokens_per_batch_ = 0;
};

}  // namespace

void bind_trainer(nb::module_& m) {
  nb::class_<PyTrainer>(m, "Trainer", "A model and its training state, stepped on the caller's batches.")
      .def(nb::init<const std::string&, const std::string&, int, int, int, int, int, int, std::uint64_t, bool, bool, bool,
                    const std::string&>(),
           "config"_a, "device"_a = "cuda", "hidden_dim"_a = 1024, "num_layers"_a = 12, "num_heads"_a = 16,
           "vocab_size"_a = 50000, "batch_size"_a = 4, "seq_length"_a = 512, "seed"_a = 42,
           "activation_checkpointing"_a = false, "cuda_graph"_a = true, "causal"_a = false, "model"_a = "simple")
      .def("step", &PyTrainer::step, "tokens"_a, "labels"_a, "lr"_a = nb::none(),
           "One optimizer step on host int32 [accumulation, batch, seq] tokens and labels; returns loss, grad_norm, "
           "skipped, lr, step.")
      .def("eval_loss", &PyTrainer::eval_loss, "tokens"_a, "labels"_a)
      .def("memory", &PyTrainer::memory, "Allocator bytes: allocated, reserved, peak.")
      .def("offload_states", &PyTrainer::offload_states, "include"_a = nb::none(), "device"_a = "cpu",
           "pin_memory"_a = true, "non_blocking"_a = false, "nvme_path"_a = "",
           "DeepSpeed's engine.offload_states: optim_states, hp_params, lp_params, lp_grads, "
           "contiguous_grad_buffer (None: all) to cpu or nvme.")
      .def("reload_states", &PyTrainer::reload_states, "non_blocking"_a = false)
      .def("offloadable_states", &PyTrainer::offloadable_states)
      .def_prop_ro("steps", &PyTrainer::steps)
      .def_prop_ro("device", &PyTrainer::describe);
}

}  // namespace cutrain::python
