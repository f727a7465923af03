// @brief The MoE layer's token exchange (model/moe_exchange.h) over an expert-parallel group's
// communicator (a group communicator of the host communicator on the CPU backend): fp64 slots
// travel as raw bytes, so the experts see exactly the values the tokens' rank computed.
#pragma once

#include <memory>

#include "model/moe_exchange.h"
#include "runtime/comm/communicator.h"

namespace cutrain::parallel {

class CommMoeExchange final : public model::MoeExchange {
 public:
  explicit CommMoeExchange(std::shared_ptr<comm::Communicator> group) : group_(std::move(group)) {}
  int size() const override { return group_->world_size(); }
  int rank() const override { return group_->rank(); }
  void all_to_all(const double* send, double* recv, std::size_t count) override;
  int max(int value) override;
  comm::Communicator& group() { return *group_; }

 private:
  std::shared_ptr<comm::Communicator> group_;
};

}  // namespace cutrain::parallel
