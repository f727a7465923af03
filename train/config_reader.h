// @brief The typed field reader the config loader is built from: every read knows its JSON path,
// so an error says "<file>: optimizer.params.betas[1]: expected a number in [0, 1), found ...".
// Internal to train/config*.cpp.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "train/choices.h"
#include "train/config_data_efficiency.h"

namespace cutrain::train::config_detail {

using nlohmann::json;

// Levenshtein distance, case-insensitive (a typo in case is still a typo, but a near one).
std::size_t edit_distance(std::string_view a, std::string_view b);
// The candidate nearest to `key` ("" when there are none).
std::string nearest(std::string_view key, const std::vector<std::string_view>& candidates);

std::string join_path(const std::string& parent, std::string_view key);

class Reader {
 public:
  Reader(std::string origin, bool strict, std::vector<std::string>* warnings)
      : origin_(std::move(origin)), strict_(strict), warnings_(warnings) {}
  const std::string& origin() const { return origin_; }

  [[noreturn]] void fail_expected(const std::string& path, const std::string& expected, const json& found,
                                  const std::string& hint = "") const;
  [[noreturn]] void fail_missing(const std::string& path, const std::string& expected, const std::string& why) const;
  [[noreturn]] void fail(const std::string& path, const std::string& why) const;
  void warn(const std::string& path, const std::string& what);
  // A warning as it is, without the origin and path prefix.
  void warn_text(const std::string& text);

  // `v` must be an object whose keys are all in the key table (train/config_keys.h) under `path`.
  // Others: a warning naming the nearest key or, strict or `unknown_is_error`, an error.
  void check_object(const json& v, const std::string& path, bool unknown_is_error = false);
  // The same with the allowed keys given (a subset of the table's, e.g. one scheduler type's).
  void check_object(const json& v, const std::string& path, const std::vector<std::string_view>& known,
                    bool unknown_is_error);
  // After the typed reads: every key present in `v` (at `path`) by its table status: a Warned key
  // whose value is not one of its fine values gets its warning, an Error key fails; sections are
  // descended into.
  void apply_key_table(const json& v, const std::string& path);
  static const json* find(const json& obj, std::string_view key);

  bool as_bool(const json& v, const std::string& path) const;
  std::string as_string(const json& v, const std::string& path) const;
  // Any JSON number that is integral (5e7 included) and within [lo, hi].
  std::int64_t as_int(const json& v, const std::string& path, std::int64_t lo, std::int64_t hi) const;
  // A finite number within the range; `lo_open`/`hi_open` make that end exclusive.
  double as_number(const json& v, const std::string& path, double lo, double hi, bool lo_open = false,
                   bool hi_open = false) const;

  // Field readers: leave `out` untouched when `key` is absent.
  void read(const json& obj, const std::string& path, std::string_view key, bool& out) const;
  void read(const json& obj, const std::string& path, std::string_view key, std::string& out) const;
  void read(const json& obj, const std::string& path, std::string_view key, int& out, std::int64_t lo,
            std::int64_t hi) const;
  void read(const json& obj, const std::string& path, std::string_view key, std::int64_t& out, std::int64_t lo,
            std::int64_t hi) const;
  void read(const json& obj, const std::string& path, std::string_view key, float& out, double lo, double hi,
            bool lo_open = false, bool hi_open = false) const;
  // One of `choices` (compared case-insensitively; `out` gets the spelling from `choices`).
  void read_choice(const json& obj, const std::string& path, std::string_view key, std::string& out,
                   const std::vector<std::string_view>& choices) const;
  // The same into an enum, by the spellings of its table (in the table's order in messages).
  template <class E, std::size_t N>
  void read_choice(const json& obj, const std::string& path, std::string_view key, E& out,
                   const std::array<Choice<E>, N>& table) const {
    std::vector<std::string_view> names;
    for (const Choice<E>& c : table) names.push_back(c.name);
    std::string text;
    read_choice(obj, path, key, text, names);
    for (const Choice<E>& c : table)
      if (text == c.name) out = c.value;
  }

 private:
  static std::string table_path(const std::string& path, std::string_view key);
  std::string origin_;
  bool strict_;
  std::vector<std::string>* warnings_;
};

std::string range_text(double lo, double hi, bool lo_open, bool hi_open);

// train/config_data_efficiency.cpp: the data_efficiency section and the legacy curriculum_learning.
void parse_data_efficiency(Reader& r, const json& j, DataEfficiencyConfig& d);
void parse_legacy_curriculum(Reader& r, const json& j, LegacyCurriculumConfig& c);

}  // namespace cutrain::train::config_detail
