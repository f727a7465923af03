// @brief The table of every DeepSpeed config key cutrain knows: acted on, read but not acted on
// (a warning at start), or an error (a feature cutrain does not have). The reader accepts exactly
// these keys (others are unknown: a warning naming the nearest, an error when strict), and after
// the typed reads one pass over the document warns or fails for each present key by its status.
// docs/config.md shows the table.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cutrain::train {

enum class KeyStatus {
  Acted,   // read and acted on
  Warned,  // read but not acted on: one warning line at start naming the key and why
  Error,   // a feature cutrain does not have: a ConfigError naming the key and why
};

struct ConfigKey {
  std::string_view path;  // JSON path; the `bf16.` keys also stand for their old name `bfloat16.`
  KeyStatus status;
  // Warned / Error: the JSON values ('|'-separated) that are what cutrain does anyway, so they
  // produce no message ("" when every value does).
  std::string_view fine;
  // Acted: what it does; Warned / Error: why not.
  std::string_view what;
  bool section = false;  // an object the reader descends into (its keys have entries of their own)
};

std::span<const ConfigKey> config_keys();
// The entry of `path` (a `bfloat16.` prefix looked up as `bf16.`), or nullptr.
const ConfigKey* find_config_key(std::string_view path);
// The last components of the keys directly under `parent` ("" for the top level).
std::vector<std::string_view> config_key_children(std::string_view parent);
// "acted on", "warned", "error".
const char* name(KeyStatus s);
// The warning text of a Warned key: "config key P is read but not acted on (why)".
std::string not_acted_warning(const std::string& path, std::string_view why);

}  // namespace cutrain::train
