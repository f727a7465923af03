#include "parallel/group_communicator.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "runtime/error.h"

namespace cutrain::parallel {
namespace {

comm::LaunchEnv group_env(int rank, int size) {
  comm::LaunchEnv e;
  e.rank = rank;
  e.world_size = size;
  e.local_rank = rank;
  e.local_world_size = size;
  e.source = "group";
  return e;
}

int index_of(const std::vector<int>& members, int rank) {
  const auto it = std::find(members.begin(), members.end(), rank);
  CUTRAIN_CHECK(it != members.end(), "group communicator: rank ", rank, " is not a member of its group");
  return int(it - members.begin());
}

class GroupCommunicator final : public comm::Communicator {
 public:
  GroupCommunicator(std::shared_ptr<comm::Communicator> parent, std::vector<int> members)
      : Communicator(group_env(index_of(members, parent->rank()), int(members.size())), parent->device()),
        parent_(std::move(parent)),
        members_(std::move(members)) {}
  const char* backend_name() const override { return parent_->backend_name(); }

  void all_reduce(void* buf, std::size_t n, DType t, comm::ReduceOp op, cudaStream_t s) override {
    CUTRAIN_CHECK(t == DType::F32, "group communicator: all_reduce of float32 only, found ", dtype_name(t));
    CUTRAIN_CHECK(op != comm::ReduceOp::Max, "group communicator: a max reduction is not built (sum and avg only)");
    std::vector<double> acc(n);
    const float* f = static_cast<const float*>(buf);
    for (std::size_t i = 0; i < n; ++i) acc[i] = double(f[i]);
    reduce_f64(acc.data(), n, s);
    if (op == comm::ReduceOp::Avg)
      for (double& v : acc) v /= double(world_size());
    float* out = static_cast<float*>(buf);
    for (std::size_t i = 0; i < n; ++i) out[i] = float(acc[i]);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t n, DType t, comm::ReduceOp op,
                      cudaStream_t s) override {
    CUTRAIN_CHECK(t == DType::F32, "group communicator: reduce_scatter of float32 only, found ", dtype_name(t));
    std::vector<float> all(static_cast<const float*>(send), static_cast<const float*>(send) + n * world_size());
    all_reduce(all.data(), all.size(), t, op, s);
    std::memcpy(recv, all.data() + std::size_t(rank()) * n, n * sizeof(float));
  }
  void all_gather(const void* send, void* recv, std::size_t n, DType t, cudaStream_t s) override {
    const std::size_t bytes = n * dtype_size(t);
    char* out = static_cast<char*>(recv);
    std::memmove(out + std::size_t(rank()) * bytes, send, bytes);
    if (rank() == 0) {
      for (int j = 1; j < world_size(); ++j)
        parent_->recv(out + std::size_t(j) * bytes, bytes, DType::U8, members_[std::size_t(j)], s);
      for (int j = 1; j < world_size(); ++j) parent_->send(out, bytes * world_size(), DType::U8, members_[j], s);
    } else {
      parent_->send(out + std::size_t(rank()) * bytes, bytes, DType::U8, members_[0], s);
      parent_->recv(out, bytes * world_size(), DType::U8, members_[0], s);
    }
  }
  void all_to_all(const void* send, void* recv, std::size_t n, DType t, cudaStream_t s) override {
    // Through the first member: it takes every member's blocks and hands each its column.
    const std::size_t bytes = n * dtype_size(t), W = std::size_t(world_size());
    if (rank() == 0) {
      std::vector<char> all(W * W * bytes);
      std::memcpy(all.data(), send, W * bytes);
      for (std::size_t j = 1; j < W; ++j)
        parent_->recv(all.data() + j * W * bytes, W * bytes, DType::U8, members_[j], s);
      std::vector<char> col(W * bytes);
      for (std::size_t j = 0; j < W; ++j) {
        for (std::size_t r = 0; r < W; ++r)
          std::memcpy(col.data() + r * bytes, all.data() + (r * W + j) * bytes, bytes);
        if (j == 0) std::memcpy(recv, col.data(), W * bytes);
        else parent_->send(col.data(), W * bytes, DType::U8, members_[j], s);
      }
    } else {
      parent_->send(send, W * bytes, DType::U8, members_[0], s);
      parent_->recv(recv, W * bytes, DType::U8, members_[0], s);
    }
  }
  void broadcast(void* buf, std::size_t n, DType t, int root, cudaStream_t s) override {
    CUTRAIN_CHECK(root >= 0 && root < world_size(), "group communicator: broadcast root ", root, " outside a group of ",
                  world_size());
    const std::size_t bytes = n * dtype_size(t);
    if (rank() == root) {
      for (int j = 0; j < world_size(); ++j)
        if (j != root) parent_->send(buf, bytes, DType::U8, members_[j], s);
    } else {
      parent_->recv(buf, bytes, DType::U8, members_[root], s);
    }
  }
  void all_reduce_sum_f64(double* buf, std::size_t n, cudaStream_t s) override { reduce_f64(buf, n, s); }
  void send(const void* buf, std::size_t n, DType t, int peer, cudaStream_t s) override {
    parent_->send(buf, n, t, member(peer, "send"), s);
  }
  void recv(void* buf, std::size_t n, DType t, int peer, cudaStream_t s) override {
    parent_->recv(buf, n, t, member(peer, "recv"), s);
  }
  void barrier(cudaStream_t s) override {
    double z = 0;
    reduce_f64(&z, 1, s);
  }

 private:
  int member(int peer, const char* what) const {
    CUTRAIN_CHECK(peer >= 0 && peer < world_size() && peer != rank(), "group communicator: ", what, " to group rank ",
                  peer, " (a group of ", world_size(), ", this is ", rank(), ")");
    return members_[std::size_t(peer)];
  }
  // In-place fp64 sum over the group, the members visited in order.
  void reduce_f64(double* buf, std::size_t n, cudaStream_t s) {
    if (world_size() == 1) return;
    const std::size_t bytes = n * sizeof(double);
    if (rank() == 0) {
      std::vector<double> acc(buf, buf + n), part(n);
      for (int j = 1; j < world_size(); ++j) {
        parent_->recv(part.data(), bytes, DType::U8, members_[j], s);
        for (std::size_t i = 0; i < n; ++i) acc[i] += part[i];
      }
      std::copy(acc.begin(), acc.end(), buf);
      for (int j = 1; j < world_size(); ++j) parent_->send(buf, bytes, DType::U8, members_[j], s);
    } else {
      parent_->send(buf, bytes, DType::U8, members_[0], s);
      parent_->recv(buf, bytes, DType::U8, members_[0], s);
    }
  }

  std::shared_ptr<comm::Communicator> parent_;
  std::vector<int> members_;
};

}  // namespace

std::unique_ptr<comm::Communicator> make_group_communicator(std::shared_ptr<comm::Communicator> parent,
                                                            const std::vector<int>& members) {
  CUTRAIN_CHECK(parent, "group communicator: no parent communicator");
  CUTRAIN_CHECK(!members.empty() && std::is_sorted(members.begin(), members.end()) &&
                    std::adjacent_find(members.begin(), members.end()) == members.end() && members.front() >= 0 &&
                    members.back() < parent->world_size(),
                "group communicator: members must be distinct ranks of the parent's ", parent->world_size(),
                ", ascending");
  return std::make_unique<GroupCommunicator>(std::move(parent), members);
}

std::shared_ptr<comm::Communicator> make_group(std::shared_ptr<comm::Communicator> parent,
                                               const std::vector<int>& members) {
  CUTRAIN_CHECK(parent, "group communicator: no parent communicator");
  if (int(members.size()) == parent->world_size()) {
    make_group_communicator(parent, members);  // the same checks: every rank, ascending
    return parent;
  }
  CUTRAIN_CHECK(!members.empty(), "group communicator: a group needs at least one member");
  // Disjoint groups: the first member names the group; the order inside it is the parent's.
  if (std::unique_ptr<comm::Communicator> sub = parent->split(members.front(), parent->rank())) {
    CUTRAIN_CHECK(sub->world_size() == int(members.size()) && sub->rank() == index_of(members, parent->rank()),
                  "group communicator: the split gave rank ", sub->rank(), " of ", sub->world_size(),
                  ", expected rank ", index_of(members, parent->rank()), " of ", members.size());
    return std::shared_ptr<comm::Communicator>(std::move(sub));
  }
  return make_group_communicator(std::move(parent), members);
}

}  // namespace cutrain::parallel
