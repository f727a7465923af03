// @brief GPU tests of the attention backward's deterministic mode (kernels::attention_backward with
// deterministic true: the wgmma dK/dV pass, then the wgmma dQ pass of kernels/attention_sm90/dq.cu)
// at the shapes the models run: BERT's d64 S128 / S512 with its key mask and dropout, GPT-2's d64
// S1024 causal, d64 S512 / S1024 and d128 S512 / S1024 plain. dQ (the dQ pass's output) and dK, dV
// against the fp64 CPU reference (the forward's own O), on poisoned outputs; the same bits on a
// second run and on a run from another stream; dQ within reach of the fast mode's (atomic) dQ, an
// independent product. With the key mask, a sequence with no valid key gets exactly zero dQ. The
// warp-specialized schedules of kernels::sm90 (producer dK/dV pass; its overlap loop with the
// overlap dQ pass) the same way: against the reference, the same bits twice.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/attention.cuh"
#include "kernels/attention_sm90/attention_sm90.h"
#include "runtime/check.h"
#include "tests/gpu/attention_checks.h"
#include "tests/reference/attention_ref.h"
#include "tests/support/test_support.h"

using namespace cutrain;
using kernels::AttentionShape;

namespace {

// (batch, seq, heads, head_dim, causal, BERT's options: key mask + dropout 0.1)
using Param = std::tuple<int, int, int, int, bool, bool>;

std::string param_name(const ::testing::TestParamInfo<Param>& i) {
  const auto [b, s, h, d, causal, bert] = i.param;
  std::ostringstream os;
  os << 'B' << b << 'S' << s << 'H' << h << 'D' << d << (causal ? "_causal" : "_full") << (bert ? "_mask_drop" : "");
  return os.str();
}

template <typename E>
void run_case(const Param& param) {
  const auto [batch, seq, heads, dim, causal, bert] = param;
  const AttentionShape sh{batch, seq, heads, dim, causal};
  const bool fp16 = std::is_same_v<E, f16>;
  auto rng = test::fresh_rng();
  const std::size_t n_qkv = 3ull * batch * seq * heads * dim, n_o = n_qkv / 3;
  const std::size_t n_l = static_cast<std::size_t>(batch) * heads * seq;
  const auto qkv_f = test::round_to<E>(test::random_normal(n_qkv, rng));
  const auto dout_f = test::round_to<E>(test::random_normal(n_o, rng));
  test::DeviceArray<E> qkv(test::to_storage<E>(qkv_f)), dout(test::to_storage<E>(dout_f));

  ref::AttentionRefOptions ro;
  kernels::AttentionOptions opt;
  test::DeviceArray<std::uint8_t> mask_d(bert ? static_cast<std::size_t>(batch) * seq : 1);
  if (bert) {
    ro.key_mask = test::option_test_mask(sh, rng);
    ro.dropout = {rng(), static_cast<std::uint32_t>(rng() % 1000), 5, nullptr};
    ro.dropout_p = 0.1f;
    CUTRAIN_CUDA_CHECK(cudaMemcpy(mask_d.get(), ro.key_mask.data(), ro.key_mask.size(), cudaMemcpyHostToDevice));
    opt.key_mask = mask_d.get();
    opt.dropout = ro.dropout;
    opt.dropout_p = ro.dropout_p;
  }

  test::DeviceArray<E> out(n_o);
  test::DeviceArray<float> lse(n_l);
  kernels::attention_forward(nullptr, qkv.get(), out.get(), lse.get(), sh, opt);
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  const auto out_h = test::download_float(out);
  ASSERT_EQ(test::count_nan(out_h), 0u) << "forward: O left unwritten";

  // Deterministic, twice (the second on another stream), each on a freshly poisoned dqkv.
  test::DeviceArray<float> scratch((kernels::attention_backward_scratch_bytes(sh, true) + 3) / 4);
  test::DeviceArray<E> det1(n_qkv), det2(n_qkv);
  kernels::attention_backward(nullptr, qkv.get(), out.get(), dout.get(), lse.get(), det1.get(), scratch.get(), sh, true,
                              opt);
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t st = nullptr;
  CUTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  kernels::attention_backward(st, qkv.get(), out.get(), dout.get(), lse.get(), det2.get(), scratch.get(), sh, true,
                              opt);
  CUTRAIN_CUDA_CHECK(cudaStreamSynchronize(st));
  CUTRAIN_CUDA_CHECK(cudaStreamDestroy(st));
  const auto raw1 = det1.download(), raw2 = det2.download();
  const auto g = test::download_float(det1);
  ASSERT_EQ(test::count_nan(g), 0u) << "dqkv left unwritten (poison survived) or NaN produced";
  std::size_t differ = 0;
  for (std::size_t i = 0; i < n_qkv; ++i) differ += std::memcmp(&raw1[i], &raw2[i], sizeof(E)) != 0;
  EXPECT_EQ(differ, 0u) << "the deterministic mode gave other bits on a second run";

  std::vector<double> dqkv_r;
  ref::attention_backward(qkv_f, out_h, dout_f, sh, dqkv_r, ro);
  const auto dv_r = test::attention_slot(dqkv_r, sh, 2);
  const double bound = fp16 ? 5e-3 : 1e-2;
  const char* names[3] = {"dQ", "dK", "dV"};
  for (int w = 0; w < 3; ++w)
    EXPECT_LE(test::attention_grad_error(test::attention_slot(g, sh, w), test::attention_slot(dqkv_r, sh, w), dv_r),
              bound)
        << names[w] << " (deterministic) vs CPU";
  if (bert) {  // sequence 0 has no valid key: its dQ rows are exactly 0
    const std::size_t row = static_cast<std::size_t>(heads) * dim;
    for (int j = 0; j < seq; ++j)
      for (std::size_t e = 0; e < row; ++e)
        ASSERT_EQ(g[3 * row * j + e], 0.f) << "dQ of token " << j << " element " << e;
  }

  // The warp-specialized schedules (kernels::sm90's, candidates for the production table): the
  // producer dK/dV pass with the serial dQ pass, its overlap loop with the overlap dQ pass; each
  // against the reference, and the same bits twice.
  using hopper_sched = std::pair<kernels::sm90::BackwardSchedule, kernels::sm90::DqSchedule>;
  for (const hopper_sched& sched :
       {hopper_sched{kernels::sm90::BackwardSchedule::Producer, kernels::sm90::DqSchedule::Serial},
        hopper_sched{kernels::sm90::BackwardSchedule::ProducerOverlap, kernels::sm90::DqSchedule::Overlap}}) {
    const bool overlap = sched.first == kernels::sm90::BackwardSchedule::ProducerOverlap;
    SCOPED_TRACE(overlap ? "producer overlap + dq overlap" : "producer + dq serial");
    test::DeviceArray<E> ws1(n_qkv), ws2(n_qkv);
    for (test::DeviceArray<E>* d : {&ws1, &ws2})
      kernels::sm90::attention_backward(nullptr, qkv.get(), out.get(), dout.get(), lse.get(), d->get(), scratch.get(),
                                        sh, sched.first, opt, true, sched.second);
    CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    const auto w1 = ws1.download(), w2 = ws2.download();
    const auto gw = test::download_float(ws1);
    ASSERT_EQ(test::count_nan(gw), 0u) << "dqkv left unwritten (poison survived) or NaN produced";
    std::size_t ws_differ = 0;
    for (std::size_t i = 0; i < n_qkv; ++i) ws_differ += std::memcmp(&w1[i], &w2[i], sizeof(E)) != 0;
    EXPECT_EQ(ws_differ, 0u) << "the deterministic mode gave other bits on a second run";
    for (int w = 0; w < 3; ++w)
      EXPECT_LE(test::attention_grad_error(test::attention_slot(gw, sh, w), test::attention_slot(dqkv_r, sh, w), dv_r),
                bound)
          << names[w] << " (deterministic) vs CPU";
  }

  // The fast mode's dQ (the dK/dV pass's atomics): both within the bound of the reference.
  test::DeviceArray<float> scratch_fast((kernels::attention_backward_scratch_bytes(sh, false) + 3) / 4);
  test::DeviceArray<E> fast(n_qkv);
  kernels::attention_backward(nullptr, qkv.get(), out.get(), dout.get(), lse.get(), fast.get(), scratch_fast.get(), sh,
                              false, opt);
  CUTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  const auto f = test::download_float(fast);
  const auto dv_g = test::attention_slot(g, sh, 2);
  EXPECT_LE(test::attention_grad_error(test::attention_slot(f, sh, 0), test::attention_slot(g, sh, 0), dv_g), 2 * bound)
      << "dQ: fast mode vs deterministic mode";
}

class AttentionDeterministicGpu : public ::testing::TestWithParam<Param> {};

TEST_P(AttentionDeterministicGpu, DqMatchesReferenceSameBits) {
  CUTRAIN_REQUIRE_GPU();
  run_case<bf16>(GetParam());
}

TEST_P(AttentionDeterministicGpu, Fp16DqMatchesReferenceSameBits) {
  CUTRAIN_REQUIRE_GPU();
  run_case<f16>(GetParam());
}

// The models' shapes (a batch and head count the fp64 reference finishes in seconds): BERT (d64,
// S128 / S512, its options; batch 4 for the mask's four kinds of sequence), GPT-2 (d64 S1024
// causal), and the plain d64 / d128 cases at S512 / S1024, causal or not.
INSTANTIATE_TEST_SUITE_P(ModelShapes, AttentionDeterministicGpu,
                         ::testing::Values(Param{4, 128, 4, 64, false, true}, Param{4, 512, 1, 64, false, true},
                                           Param{2, 512, 2, 64, false, false}, Param{1, 1024, 2, 64, true, false},
                                           Param{1, 1024, 2, 64, false, false}, Param{2, 512, 2, 128, false, false},
                                           Param{1, 1024, 2, 128, true, false}, Param{1, 1024, 1, 128, false, false}),
                         param_name);

}  // namespace
