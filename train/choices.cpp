#include "train/choices.h"

#include "runtime/error.h"

namespace cutrain::train {

void fail_choice(std::string_view what, const std::string& expected, std::string_view found) {
  throw Error(detail::concat(what, ": expected ", expected, ", found \"", found, "\""), __FILE__, __LINE__);
}

}  // namespace cutrain::train
