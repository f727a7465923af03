// @brief Splits a text file into documents: WikiText article headings (" = Title = " lines) or
// blank-line paragraphs.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace cutrain::data {

enum class SplitMode {
  kAuto,        // headings when the text has any, else paragraphs
  kHeadings,    // a new document at each level-1 WikiText heading line " = Title = "
  kParagraphs,  // documents separated by one or more blank lines
  kNone,        // the whole text is one document
};

SplitMode parse_split_mode(const std::string& name);  // "auto" | "headings" | "paragraphs" | "none"

// True for a level-1 WikiText heading line (without its newline): " = Title = ", not " = = Sub = = ".
bool is_wikitext_heading(std::string_view line);

// Views into `text`. Documents keep their text as-is (heading line included); blank lines between
// documents and empty documents are dropped.
std::vector<std::string_view> split_documents(std::string_view text, SplitMode mode);

}  // namespace cutrain::data
