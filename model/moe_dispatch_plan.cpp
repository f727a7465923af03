#include "model/moe_dispatch_plan.h"

#include <algorithm>

#include "model/moe_exchange.h"
#include "runtime/check.h"

namespace cutrain::model {

std::vector<comm::Piece> MoeDispatchPlan::scaled(const std::vector<comm::Piece>& rows, std::size_t width) {
  std::vector<comm::Piece> out = rows;
  for (comm::Piece& p : out) {
    p.offset *= width;
    p.count *= width;
  }
  return out;
}

MoeDispatchPlan make_moe_dispatch_plan(int E, int P, int rank, const std::vector<int>& kept,
                                       const std::vector<int>& received, const char* where) {
  CUTRAIN_CHECK(P >= 1 && E >= 1 && E % P == 0, where, ": ep_size ", P, " does not divide num_experts ", E);
  CUTRAIN_CHECK(rank >= 0 && rank < P, where, ": rank ", rank, " outside an expert-parallel group of ", P);
  const int El = E / P;
  CUTRAIN_CHECK(kept.size() == std::size_t(E), where, ": ", kept.size(), " kept counts, expected one per expert (", E,
                ")");
  CUTRAIN_CHECK(received.size() == std::size_t(P) * El, where, ": ", received.size(),
                " received counts, expected ep_size x local experts = ", P * El);
  for (int v : kept) CUTRAIN_CHECK(v >= 0, where, ": a negative kept count ", v);
  for (int v : received) CUTRAIN_CHECK(v >= 0, where, ": a negative received count ", v);
  MoeDispatchPlan p;
  p.members = P;
  p.rank = rank;
  p.local_experts = El;
  p.first_expert = moe_first_expert(E, P, rank);
  std::size_t at = 0;  // the permuted buffer is expert-contiguous: member j's experts one run after another
  for (int j = 0; j < P; ++j)
    for (int l = 0; l < El; ++l) {
      const std::size_t n = std::size_t(kept[std::size_t(j * El + l)]);
      p.sends.push_back({j, at, n});
      at += n;
    }
  p.send_rows = int(at);
  p.local_rows.assign(std::size_t(El), 0);
  for (int src = 0; src < P; ++src)
    for (int l = 0; l < El; ++l) p.local_rows[std::size_t(l)] += received[std::size_t(src * El + l)];
  // Expert-major: local expert l's rows start after every earlier local expert's, member by member.
  std::vector<std::size_t> base(std::size_t(El) + 1, 0);
  for (int l = 0; l < El; ++l) base[std::size_t(l) + 1] = base[std::size_t(l)] + std::size_t(p.local_rows[std::size_t(l)]);
  p.recv_rows = int(base[std::size_t(El)]);
  // Pieces from one member in the order it sends them (its runs for local experts 0, 1, ...).
  std::vector<std::size_t> fill(base.begin(), base.end() - 1);
  for (int src = 0; src < P; ++src)
    for (int l = 0; l < El; ++l) {
      const std::size_t n = std::size_t(received[std::size_t(src * El + l)]);
      p.recvs.push_back({src, fill[std::size_t(l)], n});
      fill[std::size_t(l)] += n;
    }
  return p;
}

int moe_dispatch_max_rows(int E, int P, int k, int max_tokens, bool drop_tokens, int capacity) {
  CUTRAIN_CHECK(P >= 1 && E % P == 0, "MoE dispatch: ep_size ", P, " does not divide num_experts ", E);
  const long long all = static_cast<long long>(k) * max_tokens;
  if (!drop_tokens) return int(all);
  return int(std::min<long long>(all, static_cast<long long>(E / P) * capacity));
}

}  // namespace cutrain::model
