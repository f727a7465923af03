#include "data/documents.h"

#include "runtime/error.h"

namespace cutrain::data {
namespace {

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// Calls f(begin, end) for each line of text, [begin, end) including its '\n'.
template <typename F>
void for_each_line(std::string_view text, F f) {
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t eol = text.find('\n', pos);
    const std::size_t end = eol == std::string_view::npos ? text.size() : eol + 1;
    f(pos, end);
    pos = end;
  }
}

std::string_view strip_newline(std::string_view line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  return line;
}

}  // namespace

SplitMode parse_split_mode(const std::string& name) {
  if (name == "auto") return SplitMode::kAuto;
  if (name == "headings") return SplitMode::kHeadings;
  if (name == "paragraphs") return SplitMode::kParagraphs;
  if (name == "none") return SplitMode::kNone;
  CUTRAIN_FAIL("--split: expected auto, headings, paragraphs or none, found '", name, "'");
}

bool is_wikitext_heading(std::string_view line) {
  line = strip_newline(line);
  return line.size() >= 7 && line.substr(0, 3) == " = " && line.substr(line.size() - 3) == " = " &&
         line.substr(0, 5) != " = = " && !is_blank(line.substr(3, line.size() - 6));
}

std::vector<std::string_view> split_documents(std::string_view text, SplitMode mode) {
  if (mode == SplitMode::kAuto) {
    bool any = false;
    for_each_line(text, [&](std::size_t b, std::size_t e) { any = any || is_wikitext_heading(text.substr(b, e - b)); });
    mode = any ? SplitMode::kHeadings : SplitMode::kParagraphs;
  }
  std::vector<std::string_view> docs;
  if (mode == SplitMode::kNone) {
    if (text.find_first_not_of(" \t\r\n") != std::string_view::npos) docs.push_back(text);
    return docs;
  }
  // A document runs from its first non-blank line to its last non-blank line (inclusive of '\n').
  std::size_t doc_begin = std::string_view::npos, doc_end = 0;
  auto flush = [&] {
    if (doc_begin != std::string_view::npos) docs.push_back(text.substr(doc_begin, doc_end - doc_begin));
    doc_begin = std::string_view::npos;
  };
  for_each_line(text, [&](std::size_t b, std::size_t e) {
    const std::string_view line = text.substr(b, e - b);
    if (is_blank(strip_newline(line))) {
      if (mode == SplitMode::kParagraphs) flush();
      return;
    }
    if (mode == SplitMode::kHeadings && is_wikitext_heading(line)) flush();
    if (doc_begin == std::string_view::npos) doc_begin = b;
    doc_end = e;
  });
  flush();
  return docs;
}

}  // namespace cutrain::data
