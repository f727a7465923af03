#include "data/utf8.h"

#include <algorithm>
#include <array>

#include "data/unicode_tables.h"

namespace cutrain::data {
namespace {

template <std::size_t N>
bool in_ranges(const CodepointRange (&ranges)[N], uint32_t cp) {
  const CodepointRange* end = ranges + N;
  // First range whose hi >= cp; cp is inside it when lo <= cp.
  const CodepointRange* it =
      std::lower_bound(ranges, end, cp, [](const CodepointRange& r, uint32_t c) { return r.hi < c; });
  return it != end && it->lo <= cp;
}

CharClass classify_slow(uint32_t cp) {
  if (in_ranges(kLetterRanges, cp)) return CharClass::kLetter;
  if (in_ranges(kNumberRanges, cp)) return CharClass::kNumber;
  if (in_ranges(kSpaceRanges, cp)) return CharClass::kSpace;
  return CharClass::kOther;
}

// Latin-1 is most of the text GPT-2 sees; a table avoids the binary searches there.
const std::array<CharClass, 256>& latin1_table() {
  static const std::array<CharClass, 256> table = [] {
    std::array<CharClass, 256> t{};
    for (uint32_t c = 0; c < 256; ++c) t[c] = classify_slow(c);
    return t;
  }();
  return table;
}

inline bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

Decoded decode_utf8(std::string_view text, std::size_t pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  const unsigned char b0 = s[pos];
  if (b0 < 0x80) return {b0, 1};
  const Decoded bad{kInvalidCodepoint, 1};
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (pos + 1 >= n || !is_cont(s[pos + 1])) return bad;
    return {(uint32_t(b0 & 0x1F) << 6) | (s[pos + 1] & 0x3F), 2};
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (pos + 2 >= n || !is_cont(s[pos + 1]) || !is_cont(s[pos + 2])) return bad;
    const uint32_t cp = (uint32_t(b0 & 0x0F) << 12) | (uint32_t(s[pos + 1] & 0x3F) << 6) | (s[pos + 2] & 0x3F);
    if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) return bad;  // overlong or surrogate
    return {cp, 3};
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (pos + 3 >= n || !is_cont(s[pos + 1]) || !is_cont(s[pos + 2]) || !is_cont(s[pos + 3])) return bad;
    const uint32_t cp = (uint32_t(b0 & 0x07) << 18) | (uint32_t(s[pos + 1] & 0x3F) << 12) |
                        (uint32_t(s[pos + 2] & 0x3F) << 6) | (s[pos + 3] & 0x3F);
    if (cp < 0x10000 || cp > 0x10FFFF) return bad;
    return {cp, 4};
  }
  return bad;  // continuation byte, 0xC0/0xC1, or 0xF5..0xFF
}

CharClass classify(uint32_t cp) {
  if (cp < 256) return latin1_table()[cp];
  if (cp == kInvalidCodepoint) return CharClass::kOther;
  return classify_slow(cp);
}

}  // namespace cutrain::data
