// The offload example's SimpleModel: y = W_{L-1}(... W_0 x + b_0 ...) + b_{L-1}, loss =
// CrossEntropy(y, label). Micro batch 1, so every GEMM has M = 1.
#include "tools/offload_model/offload_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "kernels/adamw.cuh"
#include "kernels/cross_entropy.cuh"
#include "runtime/check.h"
#include "tools/offload_model/offload_linear_fp32.h"

namespace cutrain::tools {

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Fills master[i] (fp32) and params[i] (bf16 bits) for i in [begin, end) with U(-bound, bound),
// a pure function of (seed, i): the same model whatever the chunking or thread count.
void init_chunk(std::uint64_t seed, std::size_t begin, std::size_t end, float bound, float* master,
                std::uint16_t* params) {
  const unsigned threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  const std::size_t n = end - begin, per = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    std::size_t lo = std::min(n, t * per), hi = std::min(n, lo + per);
    pool.emplace_back([=] {
      for (std::size_t j = lo; j < hi; ++j) {
        double u = double(splitmix64(seed * 0x100000001b3ull + begin + j) >> 11) * 0x1.0p-53;  // [0, 1)
        float v = float((2.0 * u - 1.0) * bound);
        master[j] = v;
        params[j] = f32_to_bf16_bits(v);
      }
    });
  }
  for (auto& th : pool) th.join();
}

// Checked before any CUDA call (the first member is initialized from it).
const OffloadModelOptions& validated(const OffloadModelOptions& o) {
  CUTRAIN_CHECK(o.dtype == DType::BF16 || o.dtype == DType::F32, "offload model: dtype ", dtype_name(o.dtype),
                " is not supported: the kernels have bf16 and fp32 paths only (no fp16 GEMM, loss or loss "
                "scaling); use bfloat16 or float32");
  CUTRAIN_CHECK(o.hidden >= 2, "offload model: hidden_dim must be at least 2 (classes), got ", o.hidden);
  CUTRAIN_CHECK(o.nlayers >= 1, "offload model: nlayers must be at least 1, got ", o.nlayers);
  return o;
}

}  // namespace

const std::vector<std::string>& OffloadModel::state_names() {
  static const std::vector<std::string> names{"lp_params", "lp_grads", "hp_params", "optim_states"};
  return names;
}

OffloadModel::OffloadModel(const OffloadModelOptions& o)
    : opt_(validated(o)), h_(o.hidden), L_(o.nlayers), alloc_(device_allocator()) {
  const std::size_t h = std::size_t(h_), per_layer = h * h + h;
  n_ = std::size_t(L_) * per_layer;
  cudaStream_t s = stream_.get();

  const std::size_t es = dtype_size(o.dtype);  // lp params, grads and activations: bf16 or fp32
  params_ = Buffer(alloc_, n_ * es, s);
  grads_ = Buffer(alloc_, n_ * es, s);
  master_ = Buffer(alloc_, n_ * 4, s);
  moments_ = Buffer(alloc_, 2 * n_ * 4, s);
  acts_ = Buffer(alloc_, (std::size_t(L_) + 1) * h * es, s);
  dx_ = Buffer(alloc_, 2 * h * es, s);
  labels_d_ = Buffer(alloc_, 4, s);
  loss_d_ = Buffer(alloc_, 4, s);
  status_d_ = Buffer(alloc_, 4, s);
  scratch_ = Buffer(alloc_, std::max(kernels::bias_grad_scratch_bytes(1, h_), kernels::cross_entropy_scratch_bytes(1)),
                    s);
  if (o.dtype == DType::F32) lin32_ = std::make_unique<Fp32Linear>(h_, h_, alloc_);
  else gemm_ = std::make_unique<kernels::Gemm>(&alloc_);
  // Input (bf16 or fp32), label, loss, status; fp32 mode: the logits / their gradient too.
  stage_ = Buffer(pinned_allocator(), 2 * h * 4 + 64);

  // Parameters in chunks (bounded host memory for multi-GiB models).
  const float bound = 1.f / std::sqrt(float(h_));
  const std::size_t chunk = std::size_t{1} << 24;
  std::vector<float> m(std::min(chunk, n_));
  std::vector<std::uint16_t> p(m.size());
  for (std::size_t b = 0; b < n_; b += chunk) {
    const std::size_t e = std::min(n_, b + chunk);
    init_chunk(o.seed, b, e, bound, m.data(), p.data());
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(master_.as<float>() + b, m.data(), (e - b) * 4, cudaMemcpyHostToDevice, s));
    if (o.dtype == DType::F32)  // lp params = the fp32 values, a copy apart from the master (as in DeepSpeed)
      CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(params_.as<float>() + b, m.data(), (e - b) * 4, cudaMemcpyHostToDevice, s));
    else
      CUTRAIN_CUDA_CHECK(
          cudaMemcpyAsync(params_.as<std::uint16_t>() + b, p.data(), (e - b) * 2, cudaMemcpyHostToDevice, s));
    CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));  // the host chunk is reused
  }
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(grads_.get(), 0, grads_.bytes(), s));
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(moments_.get(), 0, moments_.bytes(), s));
  stream_.synchronize();

  offloader_ = std::make_unique<StateOffloader>(alloc_, s);
  // In the order a step uses them: a reload copies them in this order, so the forward can start
  // as soon as lp_params is back while the rest is still copying.
  offloader_->add("lp_params", &params_);
  offloader_->add("lp_grads", &grads_);
  offloader_->add("hp_params", &master_);
  offloader_->add("optim_states", &moments_);
}

OffloadModel::~OffloadModel() { cudaStreamSynchronize(stream_.get()); }

std::size_t OffloadModel::state_bytes() const {
  const std::size_t es = dtype_size(opt_.dtype);
  return n_ * es + n_ * es + n_ * 4 + 2 * n_ * 4;
}

float OffloadModel::step(const float* x, int label) {
  CUTRAIN_CHECK(label >= 0 && label < h_, "offload model: label must be in [0, ", h_, "), got ", label);
  cudaStream_t s = stream_.get();
  // Anything still offloaded comes back (non-blocking); each state is waited for right before its
  // first use, so the copies of the later ones (moments, master) overlap the forward/backward.
  offloader_->reload(true);
  if (opt_.dtype == DType::F32) return step_fp32(x, label);
  const std::size_t h = std::size_t(h_), per_layer = h * h + h;

  auto* xh = stage_.as<std::uint16_t>();
  for (std::size_t i = 0; i < h; ++i) xh[i] = f32_to_bf16_bits(x[i]);
  std::memcpy(reinterpret_cast<char*>(xh) + h * 2, &label, 4);
  bf16* acts = acts_.as<bf16>();
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(acts, xh, h * 2, cudaMemcpyHostToDevice, s));
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(labels_d_.get(), reinterpret_cast<char*>(xh) + h * 2, 4, cudaMemcpyHostToDevice, s));
  CUTRAIN_CUDA_CHECK(cudaMemsetAsync(status_d_.get(), 0, 4, s));

  offloader_->wait_resident("lp_params", s);
  const bf16* P = params_.as<bf16>();
  bf16* G = grads_.as<bf16>();
  for (int l = 0; l < L_; ++l) {
    const bf16* W = P + l * per_layer;
    gemm_->forward(s, acts + l * h, W, W + h * h, acts + (l + 1) * h, 1, h_, h_, kernels::GemmEpilogue::Bias);
  }
  bf16* logits = acts + std::size_t(L_) * h;
  kernels::cross_entropy_forward_backward(s, logits, labels_d_.as<std::int32_t>(), 1, h_, h_, loss_d_.as<float>(),
                                          nullptr, status_d_.as<int>(), scratch_.get());
  // Backward: dy starts as d(logits) (in place); dx ping-pongs between the two halves of dx_.
  const bf16* dy = logits;
  offloader_->wait_resident("lp_grads", s);
  for (int l = L_ - 1; l >= 0; --l) {
    const bf16* W = P + l * per_layer;
    bf16* gW = G + l * per_layer;
    gemm_->grad_weight(s, dy, acts + l * h, gW, DType::BF16, 1, h_, h_, false);
    kernels::bias_grad(s, dy, gW + h * h, DType::BF16, 1, h_, false, scratch_.get());
    if (l > 0) {
      bf16* dx = dx_.as<bf16>() + ((L_ - 1 - l) % 2) * h;
      gemm_->grad_input(s, dy, W, dx, 1, h_, h_);
      dy = dx;
    }
  }
  const kernels::AdamParams ap = begin_optimizer(s);
  auto* m = moments_.as<float>();
  kernels::adam_step(s, kernels::OptimizerLayout::Baseline, ap, params_.as<bf16>(), G, DType::BF16,
                     master_.as<float>(), m, m + n_, n_, nullptr, nullptr);

  float loss = 0.f;
  int status = 0;
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(xh) + h * 2, loss_d_.get(), 4, cudaMemcpyDeviceToHost, s));
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(xh) + h * 2 + 4, status_d_.get(), 4,
                                     cudaMemcpyDeviceToHost, s));
  stream_.synchronize();
  std::memcpy(&loss, reinterpret_cast<char*>(xh) + h * 2, 4);
  std::memcpy(&status, reinterpret_cast<char*>(xh) + h * 2 + 4, 4);
  CUTRAIN_CHECK(status == 0, "offload model: cross-entropy reported a bad label (row ", status - 1, ")");
  return loss;
}

// Before the optimizer: the master weights and the moments resident for `s`, and this step's
// Adam parameters.
kernels::AdamParams OffloadModel::begin_optimizer(cudaStream_t s) {
  offloader_->wait_resident("hp_params", s);
  offloader_->wait_resident("optim_states", s);
  kernels::AdamParams ap;
  ap.lr = opt_.lr;
  ap.step = ++step_;
  ap.weight_decay = 0.f;
  return ap;
}

// fp32: cuBLASLt fp32 products, the loss and its gradient on the host in double (one row of
// `hidden` logits), Adam through the baseline kernel with the fp32 master (its bf16 parameter
// write goes to a transient scratch), then lp params = master.
float OffloadModel::step_fp32(const float* x, int label) {
  cudaStream_t s = stream_.get();
  const std::size_t h = std::size_t(h_), per_layer = h * h + h;
  float* xh = stage_.as<float>();
  float* logits_h = xh + h;
  std::memcpy(xh, x, h * 4);
  float* acts = acts_.as<float>();
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(acts, xh, h * 4, cudaMemcpyHostToDevice, s));
  offloader_->wait_resident("lp_params", s);
  const float* P = params_.as<float>();
  float* G = grads_.as<float>();
  for (int l = 0; l < L_; ++l) {
    const float* W = P + l * per_layer;
    lin32_->forward(s, acts + l * h, W, W + h * h, acts + (l + 1) * h);
  }
  float* logits = acts + std::size_t(L_) * h;
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(logits_h, logits, h * 4, cudaMemcpyDeviceToHost, s));
  stream_.synchronize();
  double mx = logits_h[0];
  for (std::size_t i = 1; i < h; ++i) mx = std::max(mx, double(logits_h[i]));
  double sum = 0;
  for (std::size_t i = 0; i < h; ++i) sum += std::exp(double(logits_h[i]) - mx);
  const double loss = std::log(sum) + mx - double(logits_h[label]);
  for (std::size_t i = 0; i < h; ++i)
    logits_h[i] = float(std::exp(double(logits_h[i]) - mx) / sum - (int(i) == label ? 1.0 : 0.0));
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(logits, logits_h, h * 4, cudaMemcpyHostToDevice, s));
  const float* dy = logits;
  offloader_->wait_resident("lp_grads", s);
  for (int l = L_ - 1; l >= 0; --l) {
    const float* W = P + l * per_layer;
    float* gW = G + l * per_layer;
    lin32_->grad_weight(s, dy, acts + l * h, gW);
    CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(gW + h * h, dy, h * 4, cudaMemcpyDeviceToDevice, s));  // db = dy (M = 1)
    if (l > 0) {
      float* dx = dx_.as<float>() + ((L_ - 1 - l) % 2) * h;
      lin32_->grad_input(s, dy, W, dx);
      dy = dx;
    }
  }
  const kernels::AdamParams ap = begin_optimizer(s);
  auto* m = moments_.as<float>();
  {
    Buffer bf16_out(alloc_, n_ * 2, s);
    kernels::adam_step(s, kernels::OptimizerLayout::Baseline, ap, bf16_out.as<bf16>(), G, DType::F32,
                       master_.as<float>(), m, m + n_, n_, nullptr, nullptr);
  }  // freed on `s`: reused only by later work on it
  CUTRAIN_CUDA_CHECK(cudaMemcpyAsync(params_.get(), master_.get(), n_ * 4, cudaMemcpyDeviceToDevice, s));
  stream_.synchronize();
  return float(loss);
}

void OffloadModel::offload_states(const std::vector<std::string>& include, const OffloadOptions& options) {
  offloader_->offload(include, options);
}

void OffloadModel::reload_states(bool non_blocking) { offloader_->reload(non_blocking); }

namespace {
template <typename T>
std::vector<T> download(StateOffloader& off, const char* name, const Buffer& b, cudaStream_t s) {
  off.wait_resident(name, s);
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<T> out(b.bytes() / sizeof(T));
  CUTRAIN_CUDA_CHECK(cudaMemcpy(out.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost));
  return out;
}
}  // namespace

std::vector<std::uint16_t> OffloadModel::download_params() {
  return download<std::uint16_t>(*offloader_, "lp_params", params_, stream_.get());
}
std::vector<float> OffloadModel::download_master() {
  return download<float>(*offloader_, "hp_params", master_, stream_.get());
}
std::vector<float> OffloadModel::download_moments() {
  return download<float>(*offloader_, "optim_states", moments_, stream_.get());
}

}  // namespace cutrain::tools
