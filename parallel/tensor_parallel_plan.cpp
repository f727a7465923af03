#include "parallel/tensor_parallel_plan.h"

#include <sstream>

#include "runtime/error.h"

namespace cutrain::parallel {

model::TpSlice make_tp_slice(const model::ModelDims& d, int tp, int rank, const std::string& flag) {
  CUTRAIN_CHECK(tp >= 1, flag, ": expected a tensor-parallel degree >= 1, found ", tp);
  CUTRAIN_CHECK(rank >= 0 && rank < tp, "tensor parallel: rank ", rank, " outside a group of ", tp);
  CUTRAIN_CHECK(d.heads % tp == 0, flag, " ", tp, " does not divide the attention heads (--num_heads ", d.heads,
                "): expected each rank to own whole heads");
  CUTRAIN_CHECK(d.ffn() % tp == 0, flag, " ", tp, " does not divide the FFN width (4 x --hidden_dim = ", d.ffn(), ")");
  CUTRAIN_CHECK(d.vocab_rows() % tp == 0, flag, " ", tp, " does not divide the vocabulary (", d.vocab_rows(),
                " rows of the embedding: --vocab_size ", d.vocab,
                d.padded_vocab > d.vocab ? ", padded by --pad_vocab" : "", "; pad it with --pad_vocab)");
  CUTRAIN_CHECK(tp == 1 || !d.moe.any(), flag, " ", tp,
                " with --num_experts: tensor parallelism of MoE blocks is not built (expected a dense model)");
  model::TpSlice s;
  s.rank = rank;
  s.size = tp;
  const int hp = d.heads / tp, fp = d.ffn() / tp, vp = d.vocab_rows() / tp;
  s.head_begin = rank * hp;
  s.head_end = (rank + 1) * hp;
  s.ffn_begin = rank * fp;
  s.ffn_end = (rank + 1) * fp;
  s.vocab_begin = rank * vp;
  s.vocab_end = (rank + 1) * vp;
  return s;
}

void check_domino(int pieces, int micro_batch, int tp, const std::string& flag) {
  CUTRAIN_CHECK(pieces >= 1, flag, ": expected a number of pieces >= 1, found ", pieces);
  CUTRAIN_CHECK(pieces == 1 || tp > 1, flag, " ", pieces,
                ": Domino splits the tensor-parallel all-reduces; expected --tensor_parallel_size > 1, found ", tp);
  CUTRAIN_CHECK(micro_batch % pieces == 0, flag, " ", pieces, " does not divide the micro-batch of ", micro_batch,
                " sequences (--batch_size / train_micro_batch_size_per_gpu): a piece holds whole sequences");
}

TpLayout make_tp_layout(const model::TransformerParams& t, const model::TpSlice& s) {
  const model::ModelDims& d = t.dims();
  const std::size_t h = std::size_t(d.hidden), D = std::size_t(d.head_dim()), F = std::size_t(d.ffn());
  TpLayout out;
  std::vector<bool> split(t.tensors().size(), false);
  auto rows = [&](int idx, std::size_t r0, std::size_t r1, std::size_t width) {  // rows [r0, r1) of [*, width]
    split[std::size_t(idx)] = true;
    const std::size_t o = t.tensor(idx).offset;
    out.sliced.push_back({o + r0 * width, o + r1 * width});
  };
  auto cols = [&](int idx, std::size_t nrows, std::size_t width, std::size_t c0, std::size_t c1) {
    split[std::size_t(idx)] = true;
    const std::size_t o = t.tensor(idx).offset;
    for (std::size_t r = 0; r < nrows; ++r) out.sliced.push_back({o + r * width + c0, o + r * width + c1});
  };
  const std::size_t q0 = std::size_t(s.head_begin) * D, q1 = std::size_t(s.head_end) * D;
  const std::size_t f0 = std::size_t(s.ffn_begin), f1 = std::size_t(s.ffn_end);
  rows(t.embedding(), std::size_t(s.vocab_begin), std::size_t(s.vocab_end), h);
  for (int l = 0; l < d.layers; ++l) {
    const model::LayerIndex& L = t.layer(l);
    for (std::size_t part = 0; part < 3; ++part) {  // q | k | v rows of this rank's heads
      const std::size_t o = t.tensor(L.in_proj_w).offset, ob = t.tensor(L.in_proj_b).offset;
      out.sliced.push_back({o + (part * h + q0) * h, o + (part * h + q1) * h});
      out.sliced.push_back({ob + part * h + q0, ob + part * h + q1});
    }
    split[std::size_t(L.in_proj_w)] = split[std::size_t(L.in_proj_b)] = true;
    cols(L.out_proj_w, h, h, q0, q1);
    rows(L.ff0_w, f0, f1, h);
    rows(L.ff0_b, f0, f1, 1);
    cols(L.ff2_w, h, F, f0, f1);
  }
  if (!t.tied_head()) {
    rows(t.output_w(), std::size_t(s.vocab_begin), std::size_t(s.vocab_end), h);
    if (t.output_b() >= 0) rows(t.output_b(), std::size_t(s.vocab_begin), std::size_t(s.vocab_end), 1);
  }
  for (std::size_t i = 0; i < t.tensors().size(); ++i)
    if (!split[i]) out.replicated.push_back({t.tensors()[i].offset, t.tensors()[i].offset + t.tensors()[i].count});
  out.held.assign(t.flat_size(), 0);
  out.counted.assign(t.flat_size(), 0);
  for (const Range& r : out.sliced)
    for (std::size_t i = r.begin; i < r.end; ++i) out.held[i] = out.counted[i] = 1;
  for (const Range& r : out.replicated)
    for (std::size_t i = r.begin; i < r.end; ++i) {
      out.held[i] = 1;
      if (s.rank == 0) out.counted[i] = 1;
    }
  return out;
}

TpCommPlan tp_comm_plan(const model::ModelDims& d, int B, int S, int pieces, bool embedding, int blocks, bool head) {
  const std::size_t M = std::size_t(B) * S, h = std::size_t(d.hidden);
  TpCommPlan c;
  // Forward: the embedding's lookup, each block's out-projection and FC2, the loss's max and
  // (sum-exp, target logit); backward: the head's input gradient, each block's FC1 and QKV inputs.
  c.forward_all_reduces = pieces * ((embedding ? 1 : 0) + 2 * blocks + (head ? 2 : 0));
  c.forward_elems = (embedding ? M * h : 0) + 2 * std::size_t(blocks) * M * h + (head ? 3 * M : 0);
  c.backward_all_reduces = pieces * (2 * blocks + (head ? 1 : 0));
  c.backward_elems = 2 * std::size_t(blocks) * M * h + (head ? M * h : 0);
  return c;
}

std::string describe_tp_slice(const model::TpSlice& s) {
  std::ostringstream os;
  os << "tensor parallel: rank " << s.rank << " of " << s.size << ": heads [" << s.head_begin << ", " << s.head_end
     << "), FFN columns [" << s.ffn_begin << ", " << s.ffn_end << "), vocabulary rows [" << s.vocab_begin << ", "
     << s.vocab_end << ")";
  return os.str();
}

}  // namespace cutrain::parallel
