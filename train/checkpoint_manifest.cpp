#include "train/checkpoint_manifest.h"

#include <algorithm>
#include <set>

#include "runtime/error.h"
#include "runtime/file_util.h"
#include "runtime/json_util.h"
#include "runtime/xxhash64.h"
#include "train/checkpoint_store.h"

namespace cutrain::train {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// `where`: field must exist with the kind `is` checks; `kind` says it in the error.
const json& field(const json& j, const char* key, bool (json::*is)() const noexcept, const char* kind,
                  const std::string& where) {
  CUTRAIN_CHECK(j.is_object() && j.contains(key), where, ": expected a field '", key, "' (", kind, "), found none");
  const json& v = j[key];
  CUTRAIN_CHECK((v.*is)(), where, ": field '", key, "': expected ", kind, ", found ", describe_json(v));
  return v;
}

std::uint64_t parse_hex64(const std::string& s, const std::string& where) {
  CUTRAIN_CHECK(s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos, where,
                ": expected 16 lowercase hex digits (XXH64), found '", s, "'");
  return std::stoull(s, nullptr, 16);
}

json read_json_file(const fs::path& p) { return parse_json_strict(read_text_file(p), p.string()); }

}  // namespace

const std::vector<std::string>& required_checkpoint_files() {
  static const std::vector<std::string> k{"model.safetensors", "optimizer.safetensors", "trainer_state.json",
                                          "config.json"};
  return k;
}

json manifest_json(const Manifest& m) {
  json files = json::array();
  for (const auto& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh64", xxh64_hex(f.xxh64)}});
  return {{"format", kCheckpointFormat}, {"format_version", m.format_version}, {"tag", m.tag}, {"step", m.step},
          {"checksum", "xxh64"},         {"config", m.config},                 {"files", files}};
}

Manifest parse_manifest(const json& j, const std::string& where) {
  CUTRAIN_CHECK(j.is_object(), where, ": expected a JSON object, found ", describe_json(j));
  const std::string format = field(j, "format", &json::is_string, "a string", where).get<std::string>();
  CUTRAIN_CHECK(format == kCheckpointFormat, where, ": format: expected \"", kCheckpointFormat, "\", found \"", format,
                "\"");
  Manifest m;
  m.format_version = field(j, "format_version", &json::is_number_integer, "an integer", where).get<int>();
  CUTRAIN_CHECK(m.format_version == kCheckpointFormatVersion, where, ": format_version: expected ",
                kCheckpointFormatVersion, " (what this build reads), found ", m.format_version);
  const std::string sum = field(j, "checksum", &json::is_string, "a string", where).get<std::string>();
  CUTRAIN_CHECK(sum == "xxh64", where, ": checksum: expected \"xxh64\", found \"", sum, "\"");
  m.tag = field(j, "tag", &json::is_string, "a string", where).get<std::string>();
  m.step = field(j, "step", &json::is_number_integer, "an integer", where).get<int>();
  CUTRAIN_CHECK(m.step >= 0, where, ": step: expected >= 0, found ", m.step);
  m.config = field(j, "config", &json::is_object, "an object", where);
  std::set<std::string> seen;
  for (const json& f : field(j, "files", &json::is_array, "an array", where)) {
    const std::string fw = where + ": files[" + std::to_string(m.files.size()) + "]";
    ManifestEntry e;
    e.name = field(f, "name", &json::is_string, "a string", fw).get<std::string>();
    CUTRAIN_CHECK(!e.name.empty() && e.name.find('/') == std::string::npos && e.name != kManifestFile, fw,
                  ": name: expected a file name in the folder, found '", e.name, "'");
    CUTRAIN_CHECK(seen.insert(e.name).second, fw, ": '", e.name, "' is listed twice");
    e.bytes = field(f, "bytes", &json::is_number_unsigned, "a byte count", fw).get<std::uint64_t>();
    e.xxh64 = parse_hex64(field(f, "xxh64", &json::is_string, "a string", fw).get<std::string>(), fw + ": xxh64");
    m.files.push_back(e);
  }
  for (const std::string& req : required_checkpoint_files())
    CUTRAIN_CHECK(seen.count(req), where, ": files: expected an entry for ", req, ", found none");
  return m;
}

void write_manifest(const fs::path& folder, const Manifest& m) {
  write_file_atomic(folder / kManifestFile, std::string_view(manifest_json(m).dump(2) + "\n"));
}

namespace {
void check_digest(const std::string& where, const ManifestEntry& e, std::uint64_t bytes, std::uint64_t sum) {
  CUTRAIN_CHECK(bytes == e.bytes, where, ": file ", e.name, ": expected ", e.bytes, " bytes, found ", bytes,
                bytes < e.bytes ? " (truncated)" : "");
  CUTRAIN_CHECK(sum == e.xxh64, where, ": file ", e.name, ": expected XXH64 ", xxh64_hex(e.xxh64), ", found ",
                xxh64_hex(sum), " (its content is not what this save wrote: damaged, or a file of another save)");
}
}  // namespace

void check_file_digest(const fs::path& folder, const Manifest& m, const std::string& file, std::uint64_t bytes,
                       std::uint64_t sum) {
  const std::string where = "checkpoint " + folder.string();
  for (const ManifestEntry& e : m.files)
    if (e.name == file) return check_digest(where, e, bytes, sum);
  CUTRAIN_FAIL(where, ": file ", file, ": expected in ", kManifestFile, ", not listed there");
}

VerifiedFolder verify_checkpoint_folder(const fs::path& folder, const std::vector<std::string>& checksum_later) {
  VerifiedFolder v;
  v.folder = folder;
  const fs::path mpath = folder / kManifestFile;
  std::error_code ec;
  CUTRAIN_CHECK(fs::exists(mpath, ec), "checkpoint ", folder.string(), ": expected ", kManifestFile,
                " (written last by a complete save), found none: the save did not finish");
  v.manifest = parse_manifest(read_json_file(mpath), mpath.string());
  const Manifest& m = v.manifest;
  const std::string where = "checkpoint " + folder.string();
  CUTRAIN_CHECK(m.tag == step_tag(m.step), mpath.string(), ": tag '", m.tag, "' and step ", m.step,
                " disagree (expected tag ", step_tag(m.step), ")");
  const std::string name = folder.filename().empty() ? folder.parent_path().filename().string()
                                                      : folder.filename().string();
  if (const auto s = tag_step(name))
    CUTRAIN_CHECK(*s == m.step, where, ": the folder's name says step ", *s, ", ", kManifestFile, " says step ",
                  m.step, " (a folder renamed or a manifest copied from another step)");
  for (const ManifestEntry& e : m.files) {
    const fs::path p = folder / e.name;
    CUTRAIN_CHECK(fs::is_regular_file(p, ec), where, ": file ", e.name, ": expected ", e.bytes,
                  " bytes (listed in ", kManifestFile, "), found no such file");
    const std::uint64_t size = fs::file_size(p, ec);
    CUTRAIN_CHECK(!ec && size == e.bytes, where, ": file ", e.name, ": expected ", e.bytes, " bytes, found ", size,
                  size < e.bytes ? " (truncated)" : "");
    if (std::find(checksum_later.begin(), checksum_later.end(), e.name) != checksum_later.end()) continue;
    const FileDigest d = xxh64_file(p);
    check_digest(where, e, d.bytes, d.xxh64);
  }
  const json state = read_json_file(folder / "trainer_state.json");
  CUTRAIN_CHECK(state.is_object() && state.contains("step") && state["step"].is_number_integer(), where,
                ": trainer_state.json: expected an integer 'step', found none");
  CUTRAIN_CHECK(state["step"].get<int>() == m.step, where, ": trainer_state.json: expected step ", m.step,
                " (the manifest's), found ", state["step"].get<int>());
  const json config = read_json_file(folder / "config.json");
  CUTRAIN_CHECK(config == m.config, where, ": config.json: expected the manifest's model config ", m.config.dump(),
                ", found ", config.dump());
  std::set<std::string> listed{kManifestFile};
  for (const ManifestEntry& e : m.files) listed.insert(e.name);
  for (const auto& e : fs::directory_iterator(folder, ec)) {
    const std::string n = e.path().filename().string();
    if (!listed.count(n)) v.notes.push_back(n);
  }
  std::sort(v.notes.begin(), v.notes.end());
  return v;
}

}  // namespace cutrain::train
