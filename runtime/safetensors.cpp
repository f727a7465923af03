#include "runtime/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <set>

#include "runtime/error.h"
#include "runtime/json_util.h"

namespace cutrain {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The reference implementation refuses headers over 100 MB; so do we (a corrupt length would
// otherwise ask for an absurd allocation).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeRow {
  const char* name;
  std::size_t size;
  std::optional<DType> ours;
};
constexpr DtypeRow kDtypes[] = {
    {"BOOL", 1, std::nullopt},     {"U8", 1, DType::U8},          {"I8", 1, std::nullopt},
    {"F8_E5M2", 1, std::nullopt},  {"F8_E4M3", 1, std::nullopt},  {"I16", 2, std::nullopt},
    {"U16", 2, DType::U16},        {"F16", 2, DType::F16},        {"BF16", 2, DType::BF16},
    {"I32", 4, DType::I32},        {"U32", 4, std::nullopt},      {"F32", 4, DType::F32},
    {"F64", 8, std::nullopt},      {"I64", 8, std::nullopt},      {"U64", 8, std::nullopt},
};

const DtypeRow* find_dtype(std::string_view name) {
  for (const auto& row : kDtypes)
    if (name == row.name) return &row;
  return nullptr;
}

// Element count with overflow detection; nullopt when it does not fit 64 bits.
std::optional<std::uint64_t> checked_numel(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) {
    auto u = static_cast<std::uint64_t>(d);
    if (u != 0 && n > std::numeric_limits<std::uint64_t>::max() / u) return std::nullopt;
    n *= u;
  }
  return n;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += detail::concat(i ? ", " : "", shape[i]);
  return s + "]";
}

void put_u64_le(std::uint64_t v, unsigned char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

}  // namespace

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::U16: return "U16";
    case DType::U8: return "U8";
  }
  return "?";
}

std::uint64_t SafetensorsTensorInfo::numel() const { return checked_numel(shape).value_or(0); }

// ---- writer ----

std::uint64_t SafetensorsImage::total_bytes() const {
  std::uint64_t n = prefix.size();
  for (const auto& d : data) n += d.size();
  return n;
}

SafetensorsImage safetensors_image(const fs::path& path, std::span<const SafetensorsEntry> tensors,
                                   const SafetensorsMetadata& metadata) {
  std::set<std::string_view> names;
  std::vector<std::uint64_t> bytes(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    CUTRAIN_CHECK(!t.name.empty(), "write_safetensors('", path.string(), "'): tensor #", i, " has an empty name");
    CUTRAIN_CHECK(t.name != "__metadata__", "write_safetensors('", path.string(),
                  "'): \"__metadata__\" is reserved for the metadata and cannot name a tensor");
    CUTRAIN_CHECK(names.insert(t.name).second, "write_safetensors('", path.string(), "'): tensor '", t.name,
                  "' appears twice");
    for (auto d : t.shape)
      CUTRAIN_CHECK(d >= 0, "write_safetensors('", path.string(), "'): tensor '", t.name,
                    "': expected dims >= 0, found shape ", shape_text(t.shape));
    auto n = checked_numel(t.shape);
    const std::size_t es = dtype_size(t.dtype);
    CUTRAIN_CHECK(n && *n <= std::numeric_limits<std::uint64_t>::max() / es, "write_safetensors('", path.string(),
                  "'): tensor '", t.name, "': shape ", shape_text(t.shape), " overflows 64-bit byte counts");
    bytes[i] = *n * es;
    CUTRAIN_CHECK(bytes[i] == 0 || t.data != nullptr, "write_safetensors('", path.string(), "'): tensor '", t.name,
                  "' has ", bytes[i], " bytes but a null data pointer");
  }
  // Largest element size first, then by name: offsets stay aligned without padding (no holes allowed).
  std::vector<std::size_t> order(tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    std::size_t sa = dtype_size(tensors[a].dtype), sb = dtype_size(tensors[b].dtype);
    return sa != sb ? sa > sb : tensors[a].name < tensors[b].name;
  });

  json header = json::object();
  std::uint64_t offset = 0;
  for (std::size_t i : order) {
    const auto& t = tensors[i];
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes[i]}}};
    offset += bytes[i];
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - (text.size() % 8)) % 8, ' ');  // data starts 8-byte aligned
  CUTRAIN_CHECK(text.size() <= kMaxHeaderBytes, "write_safetensors('", path.string(), "'): header of ", text.size(),
                " bytes exceeds the format's ", kMaxHeaderBytes, "-byte limit");

  unsigned char len[8];
  put_u64_le(text.size(), len);
  SafetensorsImage img;
  img.prefix.assign(reinterpret_cast<const char*>(len), 8);
  img.prefix += text;
  for (std::size_t i : order)
    if (bytes[i]) img.data.emplace_back(static_cast<const std::byte*>(tensors[i].data), bytes[i]);
  return img;
}

void write_safetensors(const fs::path& path, std::span<const SafetensorsEntry> tensors,
                       const SafetensorsMetadata& metadata) {
  const SafetensorsImage img = safetensors_image(path, tensors, metadata);
  AtomicFileWriter out(path);
  out.write(img.prefix);
  for (const auto& d : img.data) out.write(d.data(), d.size());
  out.commit();
}

// ---- reader ----

SafetensorsReader::SafetensorsReader(const fs::path& path) : file_(path) {
  const std::string f = path.string();
  const std::uint64_t size = file_.size();
  CUTRAIN_CHECK(size >= 8, "safetensors '", f, "': expected at least the 8-byte header length, found a ", size,
                "-byte file");
  unsigned char len[8];
  file_.read_at(0, len, 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  CUTRAIN_CHECK(n <= kMaxHeaderBytes, "safetensors '", f, "': header length ", n, " exceeds the format's ",
                kMaxHeaderBytes, "-byte limit (corrupt or not a safetensors file)");
  CUTRAIN_CHECK(n <= size - 8, "safetensors '", f, "': header length ", n, " runs past the end of the ", size,
                "-byte file");
  CUTRAIN_CHECK(n >= 2, "safetensors '", f, "': expected a JSON header of at least 2 bytes, found ", n);
  std::string text(n, '\0');
  file_.read_at(8, text.data(), n);
  CUTRAIN_CHECK(text[0] == '{', "safetensors '", f, "': expected the header to start with '{', found byte ",
                static_cast<int>(static_cast<unsigned char>(text[0])));
  data_start_ = 8 + n;
  const std::uint64_t data_bytes = size - data_start_;

  json header;
  try {
    header = parse_json_strict(text, "safetensors '" + f + "' header");
  } catch (const JsonSyntaxError& e) {
    CUTRAIN_FAIL(e.message());
  }
  CUTRAIN_CHECK(header.is_object(), "safetensors '", f, "': expected the header to be a JSON object, found ",
                describe_json(header));

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      CUTRAIN_CHECK(v.is_object(), "safetensors '", f, "': __metadata__: expected an object of strings, found ",
                    describe_json(v));
      for (auto m = v.begin(); m != v.end(); ++m) {
        CUTRAIN_CHECK(m.value().is_string(), "safetensors '", f, "': __metadata__.", m.key(),
                      ": expected a string, found ", describe_json(m.value()));
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = detail::concat("safetensors '", f, "': tensor '", name, "'");
    CUTRAIN_CHECK(v.is_object(), where, ": expected an object {dtype, shape, data_offsets}, found ", describe_json(v));
    for (auto k = v.begin(); k != v.end(); ++k)
      CUTRAIN_CHECK(k.key() == "dtype" || k.key() == "shape" || k.key() == "data_offsets", where, ": unexpected field '",
                    k.key(), "' (expected only dtype, shape, data_offsets)");
    SafetensorsTensorInfo t;
    t.name = name;
    auto dt = v.find("dtype");
    CUTRAIN_CHECK(dt != v.end() && dt->is_string(), where, ": expected a string dtype, found ",
                  dt == v.end() ? std::string("nothing") : describe_json(*dt));
    t.dtype_name = dt->get<std::string>();
    const DtypeRow* row = find_dtype(t.dtype_name);
    CUTRAIN_CHECK(row, where, ": unknown dtype \"", t.dtype_name, "\"");
    t.element_size = row->size;
    t.dtype = row->ours;

    auto sh = v.find("shape");
    CUTRAIN_CHECK(sh != v.end() && sh->is_array(), where, ": expected an array shape, found ",
                  sh == v.end() ? std::string("nothing") : describe_json(*sh));
    for (const auto& d : *sh) {
      CUTRAIN_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<std::int64_t>() >= 0), where,
                    ": expected shape dims to be non-negative integers, found ", describe_json(d));
      CUTRAIN_CHECK(!d.is_number_unsigned() || d.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                    where, ": shape dim ", describe_json(d), " is too large");
      t.shape.push_back(d.get<std::int64_t>());
    }
    auto off = v.find("data_offsets");
    CUTRAIN_CHECK(off != v.end() && off->is_array() && off->size() == 2 && (*off)[0].is_number_unsigned() &&
                      (*off)[1].is_number_unsigned(),
                  where, ": expected data_offsets [begin, end] of non-negative integers, found ",
                  off == v.end() ? std::string("nothing") : describe_json(*off));
    t.begin = (*off)[0].get<std::uint64_t>();
    t.end = (*off)[1].get<std::uint64_t>();
    CUTRAIN_CHECK(t.begin <= t.end, where, ": data_offsets [", t.begin, ", ", t.end, "] end before they begin");
    CUTRAIN_CHECK(t.end <= data_bytes, where, ": data_offsets [", t.begin, ", ", t.end, "] run past the ", data_bytes,
                  "-byte data section");
    auto numel = checked_numel(t.shape);
    CUTRAIN_CHECK(numel && *numel <= std::numeric_limits<std::uint64_t>::max() / t.element_size, where, ": shape ",
                  shape_text(t.shape), " overflows 64-bit byte counts");
    CUTRAIN_CHECK(*numel * t.element_size == t.bytes(), where, ": dtype ", t.dtype_name, " x shape ", shape_text(t.shape),
                  " = ", *numel * t.element_size, " bytes, but data_offsets [", t.begin, ", ", t.end, "] hold ",
                  t.bytes());
    tensors_.push_back(std::move(t));
  }
  // The data section must be covered exactly: no overlaps, no holes (as the format requires).
  std::sort(tensors_.begin(), tensors_.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t expect = 0;
  const SafetensorsTensorInfo* prev = nullptr;
  for (const auto& t : tensors_) {
    CUTRAIN_CHECK(t.begin >= expect, "safetensors '", f, "': tensor '", t.name, "' (bytes [", t.begin, ", ", t.end,
                  ")) overlaps tensor '", prev ? prev->name : "", "' (ending at ", expect, ")");
    CUTRAIN_CHECK(t.begin == expect, "safetensors '", f, "': hole in the data section: bytes [", expect, ", ", t.begin,
                  ") before tensor '", t.name, "' belong to no tensor");
    expect = t.end;
    prev = &t;
  }
  CUTRAIN_CHECK(expect == data_bytes, "safetensors '", f, "': the tensors cover ", expect,
                " bytes of data but the file holds ", data_bytes, " (trailing bytes belong to no tensor)");
  for (std::size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

bool SafetensorsReader::contains(std::string_view name) const { return index_.find(name) != index_.end(); }

const SafetensorsTensorInfo& SafetensorsReader::tensor(std::string_view name) const {
  auto it = index_.find(name);
  CUTRAIN_CHECK(it != index_.end(), "safetensors '", path().string(), "': no tensor named '", name, "' (file has ",
                tensors_.size(), " tensors)");
  return tensors_[it->second];
}

void SafetensorsReader::read(std::string_view name, void* dst, std::size_t dst_bytes) const {
  const auto& t = tensor(name);
  CUTRAIN_CHECK(dst_bytes == t.bytes(), "safetensors '", path().string(), "': tensor '", name, "' holds ", t.bytes(),
                " bytes (", t.dtype_name, " ", shape_text(t.shape), "), but the destination has ", dst_bytes);
  if (dst_bytes) file_.read_at(data_start_ + t.begin, dst, dst_bytes);
}

std::vector<std::byte> SafetensorsReader::read(std::string_view name) const {
  std::vector<std::byte> out(tensor(name).bytes());
  read(name, out.data(), out.size());
  return out;
}

}  // namespace cutrain
