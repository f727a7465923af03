// @brief An enum's table of spellings (`Choice<E>`) and the spelling of one value, for any room.
#pragma once

#include <array>
#include <cstddef>

namespace cutrain {

template <class E>
struct Choice {
  E value;
  const char* name;
};

// The spelling of `value` in `table`; `unlisted` for a value the table does not list.
template <class E, std::size_t N>
constexpr const char* choice_name(const std::array<Choice<E>, N>& table, E value, const char* unlisted = "") {
  for (const Choice<E>& c : table)
    if (c.value == value) return c.name;
  return unlisted;
}

}  // namespace cutrain
