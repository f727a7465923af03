// @brief manifest.json of a checkpoint step folder, written last: the format and its version, the
// tag and step, the model config (config.json's content) and every file of the folder with its
// size and XXH64 checksum (runtime/xxhash64.h). verify_checkpoint_folder() checks a folder against
// it before anything is loaded; every error names the folder, the file and what was expected
// against what was found. docs/training.md has the format.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace cutrain::train {

inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kCheckpointFormat = "cutrain-checkpoint";
inline constexpr int kCheckpointFormatVersion = 1;

struct ManifestEntry {
  std::string name;  // file name inside the step folder
  std::uint64_t bytes = 0;
  std::uint64_t xxh64 = 0;
};

struct Manifest {
  int format_version = kCheckpointFormatVersion;
  std::string tag;  // "global_step<N>"
  int step = 0;     // steps done = the next step to run (0-based)
  nlohmann::json config;  // the model config, as config.json holds it
  std::vector<ManifestEntry> files;
};

// The files every step folder's manifest must list.
const std::vector<std::string>& required_checkpoint_files();

nlohmann::json manifest_json(const Manifest& m);
// Parses a manifest (`where` names the file in errors): format, version, types of every field.
Manifest parse_manifest(const nlohmann::json& j, const std::string& where);

// Writes `folder/manifest.json` atomically and fsynced.
void write_manifest(const std::filesystem::path& folder, const Manifest& m);

struct VerifiedFolder {
  std::filesystem::path folder;
  Manifest manifest;
  std::vector<std::string> notes;  // files in the folder the manifest does not list (ignored)
};
// Reads `folder/manifest.json` and checks the folder against it: format and version; the folder
// name's step (global_step<N>) and trainer_state.json's step equal the manifest's; the required
// files listed; every listed file present with its size and checksum; config.json equal to the
// manifest's config. Files the manifest does not list are accepted and named in `notes` (nothing
// reads them). Throws cutrain::Error otherwise.
// `checksum_later`: files whose size is checked here and whose checksum the caller checks while it
// reads them (check_file_digest), so that a load reads them once.
VerifiedFolder verify_checkpoint_folder(const std::filesystem::path& folder,
                                        const std::vector<std::string>& checksum_later = {});
// The size and XXH64 of a file of `folder` as read against its manifest entry: the verifier's error
// (naming the folder, the file, expected and found) when they differ.
void check_file_digest(const std::filesystem::path& folder, const Manifest& manifest, const std::string& file,
                       std::uint64_t bytes, std::uint64_t xxh64);

}  // namespace cutrain::train
