// Loading the vocabulary and merge files into Gpt2Tokenizer's tables.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/byte_unicode.h"
#include "data/gpt2_tokenizer.h"
#include "data/utf8.h"
#include "runtime/error.h"

namespace cutrain::data {
namespace {

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  CUTRAIN_CHECK(in.good(), what, " '", path, "': cannot open (missing or unreadable)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A vocabulary spelling ("Ġworld") back to the bytes it stands for (" world"); false if some
// character is outside GPT-2's byte map.
bool unmap_token(std::string_view spelled, std::string& bytes) {
  bytes.clear();
  for (std::size_t pos = 0; pos < spelled.size();) {
    const Decoded d = decode_utf8(spelled, pos);
    const int b = d.cp == kInvalidCodepoint ? -1 : unicode_to_byte(d.cp);
    if (b < 0) return false;
    bytes.push_back(static_cast<char>(b));
    pos += d.len;
  }
  return !bytes.empty();
}

}  // namespace

Gpt2Tokenizer Gpt2Tokenizer::from_files(const std::string& vocab_path, const std::string& merges_path) {
  Gpt2Tokenizer tok;
  {
    const std::string text = read_text_file(vocab_path, "vocabulary file");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      CUTRAIN_FAIL("vocabulary file '", vocab_path, "': not valid JSON (", e.what(), ")");
    }
    CUTRAIN_CHECK(j.is_object() && !j.empty(), "vocabulary file '", vocab_path,
                  "': expected a JSON object {token: id}, found ", j.type_name());
    tok.token_bytes_.assign(j.size(), std::string());
    std::vector<bool> seen(j.size(), false);
    std::string bytes;
    for (const auto& [spelled, id_json] : j.items()) {
      CUTRAIN_CHECK(id_json.is_number_integer(), "vocabulary file '", vocab_path, "': token '", spelled,
                    "' has id ", id_json.dump(), ", expected an integer");
      const int64_t id = id_json.get<int64_t>();
      CUTRAIN_CHECK(id >= 0 && id < int64_t(j.size()), "vocabulary file '", vocab_path, "': token '", spelled,
                    "' has id ", id, ", expected 0..", j.size() - 1, " (ids must be dense)");
      CUTRAIN_CHECK(!seen[id], "vocabulary file '", vocab_path, "': id ", id, " is used twice (again by '",
                    spelled, "')");
      CUTRAIN_CHECK(unmap_token(spelled, bytes), "vocabulary file '", vocab_path, "': token '", spelled,
                    "' (id ", id, ") has a character outside GPT-2's byte map");
      seen[id] = true;
      tok.token_bytes_[id] = bytes;
      // Two spellings of the same bytes cannot happen in a byte-level vocabulary; keep the first.
      tok.by_bytes_.emplace(bytes, static_cast<int32_t>(id));
      if (spelled == "<|endoftext|>") tok.eot_ = static_cast<int32_t>(id);
    }
    for (int b = 0; b < 256; ++b) {
      const auto it = tok.by_bytes_.find(std::string(1, static_cast<char>(b)));
      CUTRAIN_CHECK(it != tok.by_bytes_.end(), "vocabulary file '", vocab_path, "': no token for byte 0x",
                    std::hex, b, " (a byte-level BPE vocabulary has all 256)");
      tok.byte_id_[b] = it->second;
    }
  }
  {
    const std::string text = read_text_file(merges_path, "merges file");
    std::size_t line_no = 0, rank = 0;
    std::string a_bytes, b_bytes;
    for (std::size_t pos = 0; pos < text.size();) {
      std::size_t eol = text.find('\n', pos);
      if (eol == std::string::npos) eol = text.size();
      std::string_view line(text.data() + pos, eol - pos);
      pos = eol + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty() || (line_no == 1 && line.substr(0, 8) == "#version")) continue;
      const std::size_t sp = line.find(' ');
      CUTRAIN_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                        line.find(' ', sp + 1) == std::string_view::npos,
                    "merges file '", merges_path, "' line ", line_no, ": expected two tokens 'a b', found '",
                    line, "'");
      const std::string_view a = line.substr(0, sp), b = line.substr(sp + 1);
      CUTRAIN_CHECK(unmap_token(a, a_bytes) && unmap_token(b, b_bytes), "merges file '", merges_path, "' line ",
                    line_no, ": '", line, "' has a character outside GPT-2's byte map");
      const auto ia = tok.by_bytes_.find(a_bytes), ib = tok.by_bytes_.find(b_bytes);
      const auto im = tok.by_bytes_.find(a_bytes + b_bytes);
      CUTRAIN_CHECK(ia != tok.by_bytes_.end() && ib != tok.by_bytes_.end() && im != tok.by_bytes_.end(),
                    "merges file '", merges_path, "' line ", line_no, ": '", line,
                    "' names a token (or a merged token) missing from the vocabulary '", vocab_path, "'");
      // The standard files repeat no pair; if one did, its first (lowest) rank is kept.
      tok.merges_.emplace(pair_key(ia->second, ib->second), Merge{static_cast<int32_t>(rank), im->second});
      ++rank;
    }
    CUTRAIN_CHECK(rank > 0, "merges file '", merges_path, "': no merges found");
  }
  return tok;
}

}  // namespace cutrain::data
