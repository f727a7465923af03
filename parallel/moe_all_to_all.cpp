#include "parallel/moe_all_to_all.h"

#include <algorithm>
#include <vector>

namespace cutrain::parallel {

void CommMoeExchange::all_to_all(const double* send, double* recv, std::size_t count) {
  static_assert(sizeof(double) == 2 * sizeof(float));
  group_->all_to_all(send, recv, 2 * count, DType::F32, nullptr);  // bytes moved, never converted
}

int CommMoeExchange::max(int value) {
  std::vector<std::int32_t> all(static_cast<std::size_t>(size()));
  const std::int32_t mine = value;
  group_->all_gather(&mine, all.data(), 1, DType::I32, nullptr);
  return *std::max_element(all.begin(), all.end());
}

}  // namespace cutrain::parallel
