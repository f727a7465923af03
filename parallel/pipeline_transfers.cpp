#include "parallel/pipeline_transfers.h"

#include <map>
#include <sstream>
#include <tuple>

#include "parallel/pipeline_executor.h"
#include "runtime/error.h"

namespace cutrain::parallel {
namespace {

const char* kind_name(PipeTransfer::Kind k) {
  switch (k) {
    case PipeTransfer::SendAct: return "send act";
    case PipeTransfer::RecvAct: return "recv act";
    case PipeTransfer::SendGrad: return "send grad";
    case PipeTransfer::RecvGrad: return "recv grad";
  }
  return "?";
}

std::string describe_transfer(int stage, const PipeTransfer& t) {
  std::ostringstream os;
  os << "stage " << stage << " " << kind_name(t.kind) << " " << t.micro << (t.is_send() ? " to" : " from")
     << " stage " << t.peer;
  return os.str();
}

}  // namespace

std::vector<PipeExchange> pipeline_exchanges(int stages, int stage, int m) {
  const std::vector<StageStep> program = pipeline_program(stages, stage, stage + 1, m);
  std::vector<PipeExchange> out;
  for (std::size_t i = 0; i <= program.size(); ++i) {
    PipeExchange e;
    e.before = i;
    if (i > 0) {  // what the previous action produced, to its neighbour
      const StageStep& a = program[i - 1];
      if (a.kind == PipeAction::Forward && stage + 1 < stages) e.transfers.push_back({PipeTransfer::SendAct, a.micro, stage + 1});
      if (a.kind == PipeAction::Backward && stage > 0) e.transfers.push_back({PipeTransfer::SendGrad, a.micro, stage - 1});
    }
    if (i < program.size()) {  // what the next action needs from its neighbour
      const StageStep& a = program[i];
      if (a.kind == PipeAction::Forward && stage > 0) e.transfers.push_back({PipeTransfer::RecvAct, a.micro, stage - 1});
      if (a.kind == PipeAction::Backward && stage + 1 < stages)
        e.transfers.push_back({PipeTransfer::RecvGrad, a.micro, stage + 1});
    }
    if (!e.transfers.empty()) out.push_back(std::move(e));
  }
  return out;
}

void check_pipeline_exchanges(const std::vector<std::vector<PipeExchange>>& stages) {
  const int S = int(stages.size());
  // A posted transfer by its channel (from, to) and its order on that channel.
  using Key = std::tuple<int, int, int>;
  std::map<Key, std::pair<int, PipeTransfer>> sends, recvs;
  std::map<std::pair<int, int>, int> sent, received;  // transfers posted per channel so far
  std::vector<std::size_t> at(static_cast<std::size_t>(S), 0);  // each stage's current exchange
  std::vector<std::vector<Key>> keys(static_cast<std::size_t>(S));  // its transfers' keys
  auto post = [&](int s) {
    keys[std::size_t(s)].clear();
    if (at[std::size_t(s)] == stages[std::size_t(s)].size()) return;
    for (const PipeTransfer& t : stages[std::size_t(s)][at[std::size_t(s)]].transfers) {
      CUTRAIN_CHECK(t.peer >= 0 && t.peer < S && t.peer != s, "pipeline exchanges: ", describe_transfer(s, t),
                    " names no other stage of ", S);
      Key k;
      if (t.is_send()) {
        k = {s, t.peer, sent[{s, t.peer}]++};
        sends[k] = {s, t};
      } else {
        k = {t.peer, s, received[{t.peer, s}]++};
        recvs[k] = {s, t};
      }
      keys[std::size_t(s)].push_back(k);
    }
  };
  auto matched = [&](int s, std::size_t j) {
    const PipeTransfer& t = stages[std::size_t(s)][at[std::size_t(s)]].transfers[j];
    const Key& k = keys[std::size_t(s)][j];
    const auto& other = t.is_send() ? recvs : sends;
    const auto it = other.find(k);
    if (it == other.end()) return false;
    const PipeTransfer& u = it->second.second;
    const bool same = (t.kind == PipeTransfer::SendAct && u.kind == PipeTransfer::RecvAct) ||
                      (t.kind == PipeTransfer::RecvAct && u.kind == PipeTransfer::SendAct) ||
                      (t.kind == PipeTransfer::SendGrad && u.kind == PipeTransfer::RecvGrad) ||
                      (t.kind == PipeTransfer::RecvGrad && u.kind == PipeTransfer::SendGrad);
    CUTRAIN_CHECK(same && t.micro == u.micro, "pipeline exchanges: ", describe_transfer(s, t), " meets ",
                  describe_transfer(it->second.first, u), ": expected the same micro-batch's ",
                  t.kind == PipeTransfer::SendAct || t.kind == PipeTransfer::RecvAct ? "activation" : "gradient");
    return true;
  };
  for (int s = 0; s < S; ++s) post(s);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < S; ++s) {
      if (at[std::size_t(s)] == stages[std::size_t(s)].size()) continue;
      bool done = true;
      for (std::size_t j = 0; j < keys[std::size_t(s)].size(); ++j) done = matched(s, j) && done;
      if (!done) continue;
      ++at[std::size_t(s)];
      post(s);
      progress = true;
    }
  }
  std::ostringstream waiting;
  for (int s = 0; s < S; ++s) {
    if (at[std::size_t(s)] == stages[std::size_t(s)].size()) continue;
    for (std::size_t j = 0; j < keys[std::size_t(s)].size(); ++j)
      if (!matched(s, j))
        waiting << (waiting.tellp() > 0 ? "; " : "") << describe_transfer(s, stages[std::size_t(s)][at[std::size_t(s)]].transfers[j]);
  }
  CUTRAIN_CHECK(waiting.tellp() == 0, "pipeline exchanges: the stages wait on each other (deadlock): ", waiting.str());
  CUTRAIN_CHECK(sent == received, "pipeline exchanges: every stage finished with transfers never matched (",
                sends.size(), " sends, ", recvs.size(), " receives)");
}

std::size_t pipeline_handover_elems(int rows, int seq, int hidden) {
  CUTRAIN_CHECK(rows > 0 && seq > 0 && hidden > 0, "pipeline: a hand-over of ", rows, " x ", seq, " rows of ", hidden,
                ": expected positive sizes");
  return std::size_t(rows) * std::size_t(seq) * std::size_t(hidden);
}

std::string describe_exchange(const PipeExchange& e) {
  std::ostringstream os;
  os << "before action " << e.before << ":";
  for (std::size_t i = 0; i < e.transfers.size(); ++i)
    os << (i ? "," : "") << " " << kind_name(e.transfers[i].kind) << " " << e.transfers[i].micro
       << (e.transfers[i].is_send() ? " to" : " from") << " stage " << e.transfers[i].peer;
  return os.str();
}

}  // namespace cutrain::parallel
