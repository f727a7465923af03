// @brief GPT-2's pre-tokenizer: splits text into the pieces BPE runs on, exactly as the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// does under Python's `regex` package, hand-written (no regex engine) over lenient UTF-8.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace cutrain::data {

// Length in bytes of the piece starting at text[pos] (pos < text.size()); always >= 1.
std::size_t next_piece(std::string_view text, std::size_t pos);

// All pieces of `text`, in order; their concatenation is `text`.
std::vector<std::string_view> pretokenize(std::string_view text);

}  // namespace cutrain::data
