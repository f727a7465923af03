// @brief Lenient UTF-8 decoding and the Unicode classes GPT-2's pre-tokenizer asks about.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace cutrain::data {

// A byte that does not start a valid UTF-8 sequence decodes as this, one byte long, so any input
// (invalid UTF-8 included) still splits into pieces and round-trips through the byte map.
inline constexpr uint32_t kInvalidCodepoint = 0xFFFFFFFFu;

struct Decoded {
  uint32_t cp;   // code point, or kInvalidCodepoint
  uint32_t len;  // bytes consumed, 1..4
};

// Decodes the character at text[pos] (pos < text.size()). Overlong forms, surrogates, code points
// above U+10FFFF and truncated sequences are invalid (one byte).
Decoded decode_utf8(std::string_view text, std::size_t pos);

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

// \p{L} -> kLetter, \p{N} -> kNumber, \s (White_Space) -> kSpace, everything else (and invalid
// bytes) -> kOther. Tables: data/unicode_tables.h.
CharClass classify(uint32_t cp);

}  // namespace cutrain::data
