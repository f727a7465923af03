#include "train/config_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <sstream>

#include "runtime/json_util.h"
#include "train/config.h"
#include "train/config_keys.h"

namespace cutrain::train::config_detail {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) == std::tolower(static_cast<unsigned char>(b[j - 1]));
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest(std::string_view key, const std::vector<std::string_view>& candidates) {
  std::string best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (auto c : candidates) {
    std::size_t d = edit_distance(key, c);
    if (d < best_d) {
      best_d = d;
      best = std::string(c);
    }
  }
  return best;
}

std::string join_path(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : parent + "." + std::string(key);
}

static std::string fmt_number(double x) {
  std::ostringstream os;
  os.precision(10);
  os << x;
  return os.str();
}

std::string range_text(double lo, double hi, bool lo_open, bool hi_open) {
  const double inf = std::numeric_limits<double>::infinity();
  if (hi == inf && lo == -inf) return "";
  if (hi == inf) return std::string(lo_open ? " > " : " >= ") + fmt_number(lo);
  if (lo == -inf) return std::string(hi_open ? " < " : " <= ") + fmt_number(hi);
  return detail::concat(" in ", lo_open ? "(" : "[", fmt_number(lo), ", ", fmt_number(hi), hi_open ? ")" : "]");
}

static std::string int_range_text(std::int64_t lo, std::int64_t hi) {
  if (hi == std::numeric_limits<std::int64_t>::max() || hi == std::numeric_limits<int>::max()) {
    if (lo == 1) return "a positive integer";
    if (lo == 0) return "a non-negative integer";
    return detail::concat("an integer >= ", lo);
  }
  return detail::concat("an integer in [", lo, ", ", hi, "]");
}

void Reader::fail_expected(const std::string& path, const std::string& expected, const json& found,
                           const std::string& hint) const {
  std::string msg = detail::concat(origin_, ": ", path, ": expected ", expected, ", found ", describe_json(found));
  if (!hint.empty()) msg += " (" + hint + ")";
  throw ConfigError(msg, __FILE__, __LINE__);
}

void Reader::fail_missing(const std::string& path, const std::string& expected, const std::string& why) const {
  throw ConfigError(detail::concat(origin_, ": ", path, ": expected ", expected, ", found nothing (", why, ")"),
                    __FILE__, __LINE__);
}

void Reader::fail(const std::string& path, const std::string& why) const {
  throw ConfigError(detail::concat(origin_, ": ", path, ": ", why), __FILE__, __LINE__);
}

void Reader::warn(const std::string& path, const std::string& what) {
  if (warnings_) warnings_->push_back(detail::concat(origin_, ": ", path, ": ", what));
}

void Reader::warn_text(const std::string& text) {
  if (warnings_) warnings_->push_back(text);
}

const json* Reader::find(const json& obj, std::string_view key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

void Reader::check_object(const json& v, const std::string& path, bool unknown_is_error) {
  check_object(v, path, config_key_children(path), unknown_is_error);
}

void Reader::check_object(const json& v, const std::string& path, const std::vector<std::string_view>& known,
                          bool unknown_is_error) {
  if (!v.is_object()) fail_expected(path.empty() ? "(top level)" : path, "an object", v);
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& key = it.key();
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string key_path = join_path(path, key);
    std::string near = nearest(key, known);
    std::string text = detail::concat("unknown key '", key, "'");
    if (!near.empty()) text += detail::concat(" (nearest known key: '", join_path(path, near), "')");
    if (unknown_is_error) fail(key_path, text);
    if (strict_) fail(key_path, text + "; unknown keys are errors in strict mode");
    warn(key_path, text + "; ignored");
  }
}

// `fine` is '|'-separated JSON texts.
static bool is_fine(const json& v, std::string_view fine) {
  while (!fine.empty()) {
    const std::size_t bar = fine.find('|');
    const std::string_view one = fine.substr(0, bar);
    if (json::parse(one) == v) return true;
    if (bar == std::string_view::npos) break;
    fine.remove_prefix(bar + 1);
  }
  return false;
}

void Reader::apply_key_table(const json& v, const std::string& path) {
  if (!v.is_object()) return;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string key_path = join_path(path, it.key());
    const ConfigKey* k = find_config_key(key_path);
    if (!k) continue;  // unknown: check_object has reported it
    if (k->section) {
      apply_key_table(*it, key_path);
      continue;
    }
    if (k->status == KeyStatus::Acted || (!k->fine.empty() && is_fine(*it, k->fine))) continue;
    if (k->status == KeyStatus::Error) fail(key_path, std::string(k->what));
    warn_text(not_acted_warning(key_path, k->what));
  }
}

// HF Trainer configs carry "auto" placeholders that its integration fills in; say so.
static std::string auto_hint(const json& v) {
  return v.is_string() && v.get<std::string>() == "auto"
             ? "\"auto\" is a placeholder the Hugging Face Trainer fills in; write the value"
             : "";
}

bool Reader::as_bool(const json& v, const std::string& path) const {
  if (!v.is_boolean()) fail_expected(path, "a boolean (true or false)", v, auto_hint(v));
  return v.get<bool>();
}

std::string Reader::as_string(const json& v, const std::string& path) const {
  if (!v.is_string()) fail_expected(path, "a string", v);
  return v.get<std::string>();
}

std::int64_t Reader::as_int(const json& v, const std::string& path, std::int64_t lo, std::int64_t hi) const {
  const std::string expected = int_range_text(lo, hi);
  std::int64_t x = 0;
  if (v.is_number_unsigned()) {
    std::uint64_t u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(hi)) fail_expected(path, expected, v);
    x = static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<std::int64_t>();
  } else if (v.is_number_float()) {
    // DeepSpeed users write 5e7 for a bucket size: accept any float that is an exact integer.
    double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) fail_expected(path, expected, v, "not an integral value");
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi)) fail_expected(path, expected, v);
    x = static_cast<std::int64_t>(d);
  } else {
    fail_expected(path, expected, v, auto_hint(v));
  }
  if (x < lo || x > hi) fail_expected(path, expected, v);
  return x;
}

double Reader::as_number(const json& v, const std::string& path, double lo, double hi, bool lo_open,
                         bool hi_open) const {
  const std::string expected = "a number" + range_text(lo, hi, lo_open, hi_open);
  if (!v.is_number()) fail_expected(path, expected, v, auto_hint(v));
  double d = v.get<double>();
  bool ok = std::isfinite(d) && (lo_open ? d > lo : d >= lo) && (hi_open ? d < hi : d <= hi);
  if (!ok) fail_expected(path, expected, v);
  return d;
}

// The path of a key a parse function reads: it must have an entry in the key table, so no key is
// read without a status (a programming error otherwise, found by the tests that read it).
std::string Reader::table_path(const std::string& path, std::string_view key) {
  std::string p = join_path(path, key);
  CUTRAIN_CHECK(find_config_key(p) != nullptr, "config key ", p, " is read but has no entry in train/config_keys.cpp");
  return p;
}

void Reader::read(const json& obj, const std::string& path, std::string_view key, bool& out) const {
  if (const json* v = find(obj, key)) out = as_bool(*v, table_path(path, key));
}

void Reader::read(const json& obj, const std::string& path, std::string_view key, std::string& out) const {
  if (const json* v = find(obj, key)) out = as_string(*v, table_path(path, key));
}

void Reader::read(const json& obj, const std::string& path, std::string_view key, int& out, std::int64_t lo,
                  std::int64_t hi) const {
  hi = std::min<std::int64_t>(hi, std::numeric_limits<int>::max());
  if (const json* v = find(obj, key)) out = static_cast<int>(as_int(*v, table_path(path, key), lo, hi));
}

void Reader::read(const json& obj, const std::string& path, std::string_view key, std::int64_t& out,
                  std::int64_t lo, std::int64_t hi) const {
  if (const json* v = find(obj, key)) out = as_int(*v, table_path(path, key), lo, hi);
}

void Reader::read(const json& obj, const std::string& path, std::string_view key, float& out, double lo, double hi,
                  bool lo_open, bool hi_open) const {
  if (const json* v = find(obj, key))
    out = static_cast<float>(as_number(*v, table_path(path, key), lo, hi, lo_open, hi_open));
}

void Reader::read_choice(const json& obj, const std::string& path, std::string_view key, std::string& out,
                         const std::vector<std::string_view>& choices) const {
  const json* v = find(obj, key);
  if (!v) return;
  std::string p = table_path(path, key);
  std::string expected = "one of";
  for (std::size_t i = 0; i < choices.size(); ++i) expected += detail::concat(i ? ", " : " ", "\"", choices[i], "\"");
  if (!v->is_string()) fail_expected(p, expected, *v, auto_hint(*v));
  std::string s = v->get<std::string>();
  for (auto c : choices) {
    if (s.size() == c.size() && edit_distance(s, c) == 0) {
      out = std::string(c);
      return;
    }
  }
  fail_expected(p, expected, *v);
}

}  // namespace cutrain::train::config_detail
