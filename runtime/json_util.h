// @brief Strict JSON parsing shared by the config loader and the safetensors reader: parse errors
// give line and column, and a repeated key is an error (nlohmann would silently keep the last one).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "runtime/error.h"

namespace cutrain {

class JsonSyntaxError : public Error {
 public:
  JsonSyntaxError(std::string message, int line, int column, const char* file, int src_line)
      : Error(std::move(message), file, src_line), line_(line), column_(column) {}
  int json_line() const { return line_; }      // 1-based; 0 when not a position error (duplicate key)
  int json_column() const { return column_; }  // 1-based

 private:
  int line_, column_;
};

// Parses `text`; `origin` (a file name) starts every message. Duplicate keys are reported with their
// JSON path, e.g. "zero_optimization.stage".
nlohmann::json parse_json_strict(const std::string& text, const std::string& origin);

// "string \"abc\"", "number 1.5", "boolean true", "null", "array [1,2]": how a message shows a value.
std::string describe_json(const nlohmann::json& value);

}  // namespace cutrain
