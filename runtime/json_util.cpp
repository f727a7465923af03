#include "runtime/json_util.h"

#include <set>
#include <vector>

namespace cutrain {
using nlohmann::json;

namespace {

// Position of the byte at 1-based `byte` (nlohmann's parse_error::byte) as 1-based line/column.
void line_column(const std::string& text, std::size_t byte, int* line, int* column) {
  *line = 1;
  *column = 1;
  std::size_t end = std::min(byte == 0 ? 0 : byte - 1, text.size());
  for (std::size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++*line;
      *column = 1;
    } else {
      ++*column;
    }
  }
}

// nlohmann's what() is "[json.exception.parse_error.101] parse error at line 3, column 5: <why>";
// keep only <why>, since we print the position ourselves.
std::string parse_reason(const char* what) {
  std::string s = what;
  auto at = s.find("parse error");
  if (at == std::string::npos) return s;
  auto colon = s.find(": ", at);
  return colon == std::string::npos ? s : s.substr(colon + 2);
}

struct Frame {
  bool is_object;
  std::set<std::string> keys;
  std::string current_key;
};

std::string frames_path(const std::vector<Frame>& frames, const std::string& last_key) {
  std::string path;
  for (std::size_t i = 0; i + 1 < frames.size(); ++i) {
    if (frames[i].is_object) {
      if (!path.empty()) path += '.';
      path += frames[i].current_key;
    } else {
      path += "[]";
    }
  }
  if (!path.empty()) path += '.';
  return path + last_key;
}

}  // namespace

json parse_json_strict(const std::string& text, const std::string& origin) {
  std::vector<Frame> frames;
  std::string duplicate;
  json::parser_callback_t cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: frames.push_back({true, {}, {}}); break;
      case json::parse_event_t::array_start: frames.push_back({false, {}, {}}); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames.empty()) frames.pop_back();
        break;
      case json::parse_event_t::key: {
        if (frames.empty()) break;
        std::string key = parsed.get<std::string>();
        if (!frames.back().keys.insert(key).second && duplicate.empty()) duplicate = frames_path(frames, key);
        frames.back().current_key = key;
        break;
      }
      case json::parse_event_t::value: break;
    }
    return true;
  };
  json value;
  try {
    value = json::parse(text, cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::parse_error& e) {
    int line, column;
    line_column(text, e.byte, &line, &column);
    throw JsonSyntaxError(detail::concat(origin, ": malformed JSON at line ", line, ", column ", column, ": ",
                                         parse_reason(e.what())),
                          line, column, __FILE__, __LINE__);
  } catch (const json::exception& e) {
    // e.g. out_of_range.406 "number overflow parsing '1e999'": no position given, so find the token.
    std::string what = e.what();
    auto q1 = what.find('\''), q2 = what.rfind('\'');
    int line = 0, column = 0;
    if (q1 != std::string::npos && q2 > q1) {
      auto at = text.find(what.substr(q1 + 1, q2 - q1 - 1));
      if (at != std::string::npos) line_column(text, at + 1, &line, &column);
    }
    std::string where = line ? detail::concat(" at line ", line, ", column ", column) : std::string();
    auto close = what.find("] ");
    throw JsonSyntaxError(detail::concat(origin, ": malformed JSON", where, ": ",
                                         close == std::string::npos ? what : what.substr(close + 2)),
                          line, column, __FILE__, __LINE__);
  }
  if (!duplicate.empty())
    throw JsonSyntaxError(detail::concat(origin, ": key '", duplicate,
                                         "' appears more than once (JSON readers disagree on which one wins)"),
                          0, 0, __FILE__, __LINE__);
  return value;
}

std::string describe_json(const json& v) {
  std::string text = v.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean " + text;
    case json::value_t::string: return "string " + text;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "number " + text;
    case json::value_t::array: return "array " + text;
    case json::value_t::object: return "object " + text;
    default: return text;
  }
}

}  // namespace cutrain
