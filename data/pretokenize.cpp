#include "data/pretokenize.h"

#include "data/utf8.h"

namespace cutrain::data {
namespace {

struct Char {
  CharClass cls;
  uint32_t len;
};

inline Char char_at(std::string_view text, std::size_t pos) {
  const Decoded d = decode_utf8(text, pos);
  return {classify(d.cp), d.len};
}

// End of the run of characters of class `cls` starting at pos.
std::size_t run_end(std::string_view text, std::size_t pos, CharClass cls) {
  while (pos < text.size()) {
    const Char c = char_at(text, pos);
    if (c.cls != cls) break;
    pos += c.len;
  }
  return pos;
}

// 's 't 're 've 'm 'll 'd (case-sensitive, ASCII apostrophe only, as in GPT-2).
std::size_t contraction_len(std::string_view text, std::size_t pos) {
  const std::string_view rest = text.substr(pos + 1);
  if (rest.empty()) return 0;
  const char a = rest[0];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (rest.size() >= 2) {
    const char b = rest[1];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  return 0;
}

}  // namespace

std::size_t next_piece(std::string_view text, std::size_t pos) {
  if (text[pos] == '\'') {
    if (const std::size_t n = contraction_len(text, pos)) return n;
  }
  const Char c = char_at(text, pos);
  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional U+0020 glued to the run after it.
  if (text[pos] == ' ' && pos + 1 < text.size()) {
    const Char next = char_at(text, pos + 1);
    if (next.cls != CharClass::kSpace) return run_end(text, pos + 1, next.cls) - pos;
  }
  if (c.cls != CharClass::kSpace) return run_end(text, pos, c.cls) - pos;
  // "\s+(?!\S)" then "\s+": a whitespace run keeps its last character for the word after it,
  // unless the run ends the text or is a single character.
  std::size_t end = pos, last = pos;
  while (end < text.size()) {
    const Char w = char_at(text, end);
    if (w.cls != CharClass::kSpace) break;
    last = end;
    end += w.len;
  }
  if (end == text.size() || last == pos) return end - pos;
  return last - pos;
}

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t n = next_piece(text, pos);
    pieces.push_back(text.substr(pos, n));
    pos += n;
  }
  return pieces;
}

}  // namespace cutrain::data
