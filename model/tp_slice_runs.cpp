#include "model/tp_slice_runs.h"

namespace cutrain::model {

TpBlockRuns tp_block_runs(const ModelDims& d, const TpSlice& s) {
  const std::size_t h = std::size_t(d.hidden), D = std::size_t(d.head_dim()), F = std::size_t(d.ffn());
  const std::size_t q0 = std::size_t(s.head_begin) * D, hl = std::size_t(s.head_end - s.head_begin) * D;
  const std::size_t f0 = std::size_t(s.ffn_begin), fl = std::size_t(s.ffn_end - s.ffn_begin);
  TpBlockRuns r;
  r.qkv_w = SliceRuns{q0 * h, hl * h, 3, h * h};  // rows q0.. of the q, k and v parts of [3h, h]
  r.qkv_b = SliceRuns{q0, hl, 3, h};
  r.out_proj_w = SliceRuns{q0, hl, h, h};  // columns of [h, h]
  r.ff0_w = SliceRuns{f0 * h, fl * h, 1, fl * h};  // rows of [F, h]: one block
  r.ff0_b = SliceRuns{f0, fl, 1, fl};
  r.ff2_w = SliceRuns{f0, fl, h, F};  // columns of [h, F]
  return r;
}

std::vector<std::pair<int, SliceRuns>> tp_sliced_runs(const TransformerParams& t, const TpSlice& s) {
  const ModelDims& d = t.dims();
  const std::size_t h = std::size_t(d.hidden), v0 = std::size_t(s.vocab_begin);
  const std::size_t vl = std::size_t(s.vocab_end - s.vocab_begin);
  std::vector<std::pair<int, SliceRuns>> out;
  out.push_back({t.embedding(), SliceRuns{v0 * h, vl * h, 1, vl * h}});
  const TpBlockRuns b = tp_block_runs(d, s);
  for (int l = 0; l < d.layers; ++l) {
    const LayerIndex& L = t.layer(l);
    out.push_back({L.in_proj_w, b.qkv_w});
    out.push_back({L.in_proj_b, b.qkv_b});
    out.push_back({L.out_proj_w, b.out_proj_w});
    out.push_back({L.ff0_w, b.ff0_w});
    out.push_back({L.ff0_b, b.ff0_b});
    out.push_back({L.ff2_w, b.ff2_w});
  }
  if (!t.tied_head()) {
    out.push_back({t.output_w(), SliceRuns{v0 * h, vl * h, 1, vl * h}});
    if (t.output_b() >= 0) out.push_back({t.output_b(), SliceRuns{v0, vl, 1, vl}});
  }
  return out;
}

}  // namespace cutrain::model
