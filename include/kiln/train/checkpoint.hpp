// Checkpoints in the safetensors format: every parameter and optimizer-state tensor by name,
// the training position in the header's metadata with a CRC-32 of the data, written so that a
// crash at any moment leaves the previous file or the new one whole.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/core/error.hpp"
#include "kiln/core/regular_file.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/train/train_step.hpp"

namespace kiln {

/// Where training stood when a checkpoint was written, kept in the file's metadata.
struct CheckpointInfo {
  std::int64_t step = 0;  ///< training steps completed
  std::int64_t epoch = 0; ///< the epoch the next step belongs to
  std::int64_t batch = 0; ///< the next step's batch within that epoch
  std::uint64_t seed = 0; ///< the seed of the batch order
  /// Anything else the trainer wants back (strings, as safetensors' metadata holds).
  std::map<std::string, std::string> metadata{};
};

/// Largest header a checkpoint may have: far above any network's, so a hostile length field
/// cannot drive a huge allocation.
inline constexpr std::uint64_t checkpoint_max_header = std::uint64_t{1} << 26;

/// Every tensor a network needs to compute: its parameters, then its buffers (batchnorm's
/// running statistics). Loading these from a training checkpoint (with
/// CheckpointLoad::skip_unlisted) restores the model without its optimizer.
inline std::vector<nn::Parameter> model_state(const nn::Module& net) {
  std::vector<nn::Parameter> all = net.parameters();
  for (const nn::Parameter& b : net.buffers()) all.push_back(b);
  return all;
}

/// Every tensor a training step keeps between runs: model_state, then the optimizer's state
/// (learning rate, momentum buffers, Adam's moments and step counter).
inline std::vector<nn::Parameter> training_state(const nn::Module& net, const TrainStep& step) {
  std::vector<nn::Parameter> all = model_state(net);
  all.insert(all.end(), step.optimizer.tensors.begin(), step.optimizer.tensors.end());
  return all;
}

namespace detail {

inline std::string safetensors_dtype(DType t) { return t == DType::f32 ? "F32" : "I32"; }

inline std::size_t tensor_bytes(const Tensor& t) {
  return static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype());
}

/// Closes a POSIX file descriptor when it goes.
struct Descriptor {
  int fd = -1;
  explicit Descriptor(int f) : fd(f) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

inline void write_all(int fd, const void* data, std::size_t bytes, const std::string& what) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(errc::checkpoint_io, what + ": write failed: " + std::strerror(errno));
    if (n == 0)
      fail(errc::checkpoint_io, what + ": write stopped with " + std::to_string(bytes) +
                                    " bytes left (the file system accepts no more)");
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

inline constexpr const char* checksum_key = "kiln.crc32";

/// Continues `crc` over the header in one canonical spelling (sorted keys, no spaces) without
/// its checksum entry, so that a changed name, shape, offset or position is caught as surely as
/// a changed weight.
inline std::uint32_t header_crc(uLong crc, nlohmann::json header) {
  header["__metadata__"].erase(checksum_key);
  const std::string canonical = header.dump();
  return static_cast<std::uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(canonical.data()), canonical.size()));
}

/// The start of every temporary file save_checkpoint writes for `file`; the writer's process id
/// follows, then a number unique within that process.
inline std::string temporary_prefix(const std::filesystem::path& file) {
  return "." + file.filename().string() + ".tmp";
}

/// Removes the temporary files that saves of `file` left behind when their process was killed
/// before it could rename or remove them: those whose writer's process id no longer exists on
/// this machine. A live writer's file is left alone, even when another thread of this process
/// writes it.
inline void remove_abandoned_temporaries(const std::filesystem::path& folder,
                                         const std::filesystem::path& file) {
  const std::string prefix = temporary_prefix(file);
  std::error_code ec;
  for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    long long pid = 0;
    const char* digits = name.data() + prefix.size();
    const auto [stop, error] = std::from_chars(digits, name.data() + name.size(), pid);
    if (error != std::errc() || stop == digits || pid <= 0 || *stop != '.') continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::error_code ignored;
      std::filesystem::remove(it->path(), ignored);
    }
  }
}

} // namespace detail

/// Writes `tensors` (unique names) and `info` to `path` as safetensors: an 8-byte little-endian
/// header length, a JSON header naming each tensor's dtype, shape and byte range, then the
/// data. It goes to a temporary file in the same folder, is synced, renamed over `path` and the
/// folder synced, so a crash leaves either the old checkpoint or the new one, never a part.
/// Temporary files of earlier saves of `path` whose process died are removed first. Saves of
/// different paths may run at once, from any threads; two saves of one path at once leave one
/// of the two whole files.
/// On a device with memory of its own, call Executor::download_params first.
inline void save_checkpoint(const std::filesystem::path& path,
                            std::span<const nn::Parameter> tensors, const CheckpointInfo& info) {
  const std::string name = path.string();
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::set<std::string> seen;
  std::uint64_t offset = 0;
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const nn::Parameter& p : tensors) {
    if (!p.tensor) fail(errc::argument, name + ": tensor '" + p.name + "' has no data");
    if (p.name == "__metadata__" || !seen.insert(p.name).second)
      fail(errc::argument, name + ": tensor name '" + p.name + "' is used twice or reserved");
    const std::size_t bytes = detail::tensor_bytes(*p.tensor);
    header[p.name] = {
        {"dtype", detail::safetensors_dtype(p.tensor->dtype())},
        {"shape", std::vector<std::int64_t>(p.tensor->shape().begin(), p.tensor->shape().end())},
        {"data_offsets", {offset, offset + bytes}}};
    crc = crc32_z(crc, static_cast<const Bytef*>(p.tensor->data()), bytes);
    offset += bytes;
  }
  nlohmann::ordered_json metadata = {{"format", "kiln"},
                                     {"kiln.step", std::to_string(info.step)},
                                     {"kiln.epoch", std::to_string(info.epoch)},
                                     {"kiln.batch", std::to_string(info.batch)},
                                     {"kiln.seed", std::to_string(info.seed)},
                                     {"kiln.data_bytes", std::to_string(offset)}};
  for (const auto& [key, value] : info.metadata) {
    if (key.starts_with("kiln.") || key == "format")
      fail(errc::argument, name + ": metadata key '" + key + "' is reserved for kiln");
    metadata[key] = value;
  }
  header["__metadata__"] = metadata;
  crc = detail::header_crc(crc, nlohmann::json(header));
  header["__metadata__"][detail::checksum_key] = std::to_string(crc);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' '); // the data starts 8-byte aligned
  std::uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<std::uint8_t>(text.size() >> (8 * i));

  const std::filesystem::path folder = path.has_parent_path() ? path.parent_path() : ".";
  detail::remove_abandoned_temporaries(folder, path);
  static std::atomic<std::uint64_t> saves{0};
  const std::filesystem::path temporary =
      folder / (detail::temporary_prefix(path) + std::to_string(::getpid()) + "." +
                std::to_string(saves.fetch_add(1)));
  {
    detail::Descriptor file(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644));
    if (file.fd < 0)
      fail(errc::checkpoint_io,
           name + ": cannot create " + temporary.string() + ": " + std::strerror(errno));
    try {
      detail::write_all(file.fd, length, 8, name);
      detail::write_all(file.fd, text.data(), text.size(), name);
      for (const nn::Parameter& p : tensors)
        detail::write_all(file.fd, p.tensor->data(), detail::tensor_bytes(*p.tensor), name);
      if (::fsync(file.fd) != 0)
        fail(errc::checkpoint_io, name + ": fsync failed: " + std::strerror(errno));
    } catch (...) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      throw;
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    fail(errc::checkpoint_io, name + ": cannot rename the written file into place: " + why);
  }
  const detail::Descriptor dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY));
  if (dir.fd < 0 || ::fsync(dir.fd) != 0)
    fail(errc::checkpoint_io, name + ": cannot sync its folder: " + std::strerror(errno));
}

namespace detail {

/// A checkpoint opened and its header read and checked: a JSON object with a __metadata__
/// object whose data size matches the file's. The data is not yet read.
struct CheckpointHeader {
  RegularFile opened;
  nlohmann::json header;
  std::uint64_t data_bytes = 0;
};

/// The metadata entry `key` of `meta` as a number below 2^63, or kiln.checkpoint.format.
inline std::uint64_t metadata_number(const std::string& name, const nlohmann::json& meta,
                                     const char* key) {
  if (!meta.contains(key) || !meta[key].is_string())
    fail(errc::checkpoint_format, name + ": metadata '" + key + "' is missing");
  const std::string& v = meta[key].get_ref<const std::string&>();
  std::uint64_t number = 0;
  const auto [end, error] = std::from_chars(v.data(), v.data() + v.size(), number);
  if (v.empty() || error != std::errc() || end != v.data() + v.size() ||
      number > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    fail(errc::checkpoint_format,
         name + ": metadata '" + key + "' is not a number below 2^63: " + v.substr(0, 40));
  return number;
}

inline CheckpointHeader read_checkpoint_header(const std::filesystem::path& path) {
  const std::string name = path.string();
  CheckpointHeader result{
      .opened = open_regular_file(path, errc::checkpoint_io), .header = {}, .data_bytes = 0};
  const std::uint64_t size = result.opened.size;
  std::FILE* const file = result.opened.file.get();
  const auto read = [&](void* into, std::size_t bytes, const char* what) {
    if (std::fread(into, 1, bytes, file) != bytes)
      fail(errc::checkpoint_format, name + ": the file ends inside its " + std::string(what));
  };

  std::uint8_t length[8];
  if (size < 8)
    fail(errc::checkpoint_format, name + ": " + std::to_string(size) +
                                      " bytes, "
                                      "shorter than a safetensors header length");
  read(length, 8, "header length");
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | length[i];
  if (header_bytes > checkpoint_max_header || header_bytes > size - 8)
    fail(errc::checkpoint_format, name + ": header length " + std::to_string(header_bytes) +
                                      " does not fit the file's " + std::to_string(size) +
                                      " bytes");
  std::string text(static_cast<std::size_t>(header_bytes), '\0');
  read(text.data(), text.size(), "header");
  nlohmann::json& header = result.header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(errc::checkpoint_format, name + ": the header is not JSON: " + e.what());
  }
  result.data_bytes = size - 8 - header_bytes;
  if (!header.is_object() || !header.contains("__metadata__") ||
      !header["__metadata__"].is_object())
    fail(errc::checkpoint_format, name + ": the header has no __metadata__ object");
  const std::uint64_t said = metadata_number(name, header["__metadata__"], "kiln.data_bytes");
  if (said != result.data_bytes)
    fail(errc::checkpoint_format, name + ": holds " + std::to_string(result.data_bytes) +
                                      " bytes of data, its header says " + std::to_string(said) +
                                      " (truncated or appended to)");
  return result;
}

/// The training position and the trainer's own entries in a checked header's metadata.
inline CheckpointInfo checkpoint_position(const std::string& name, const nlohmann::json& meta) {
  CheckpointInfo info;
  info.step = static_cast<std::int64_t>(metadata_number(name, meta, "kiln.step"));
  info.epoch = static_cast<std::int64_t>(metadata_number(name, meta, "kiln.epoch"));
  info.batch = static_cast<std::int64_t>(metadata_number(name, meta, "kiln.batch"));
  info.seed = metadata_number(name, meta, "kiln.seed");
  for (const auto& [key, value] : meta.items())
    if (!key.starts_with("kiln.") && key != "format" && value.is_string())
      info.metadata[key] = value.get<std::string>();
  return info;
}

} // namespace detail

/// Where training stood in the checkpoint at `path` and its trainer's metadata, from the header
/// alone (checked as load_checkpoint checks it; the data is neither read nor verified), so a
/// trainer can compare its settings with the file's before loading any tensor.
inline CheckpointInfo read_checkpoint_info(const std::filesystem::path& path) {
  const detail::CheckpointHeader checked = detail::read_checkpoint_header(path);
  return detail::checkpoint_position(path.string(), checked.header["__metadata__"]);
}

/// How load_checkpoint treats a file that holds more than it is asked for.
struct CheckpointLoad {
  /// false: a tensor in the file that is not among those asked for is kiln.checkpoint.mismatch
  /// (a checkpoint of another network). true: it is checked like the others and then skipped,
  /// as when a model's weights are read from a training checkpoint without the optimizer's
  /// state (PyTorch's strict=False, without its tolerance of missing tensors).
  bool skip_unlisted = false;
};

/// Reads the checkpoint at `path` into `tensors`, whose names, dtypes and shapes must match the
/// file's exactly (a tensor asked for and missing from the file, or, unless
/// `options.skip_unlisted`, one in the file and not asked for, is kiln.checkpoint.mismatch
/// naming it), and returns where training stood. The header is validated field by field and the
/// data against its CRC-32 before any tensor is written, so a truncated, corrupt or foreign file is
/// a kiln::Error (kiln.checkpoint.*) and leaves the tensors as they were.
inline CheckpointInfo load_checkpoint(const std::filesystem::path& path,
                                      std::span<const nn::Parameter> tensors,
                                      CheckpointLoad options = {}) {
  const std::string name = path.string();
  const detail::CheckpointHeader checked = detail::read_checkpoint_header(path);
  const nlohmann::json& header = checked.header;
  const nlohmann::json& meta = header["__metadata__"];
  const std::uint64_t data_bytes = checked.data_bytes;

  // Every tensor in the file is checked, listed or not, so that the file's data is accounted
  // for byte by byte whichever tensors are read from it.
  struct Entry {
    std::string dtype;
    std::vector<std::int64_t> shape;
    std::uint64_t begin = 0, end = 0;
  };
  std::map<std::string, Entry> entries;
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") continue;
    const std::string tensor = name + ": tensor '" + key + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() || !entry.contains("data_offsets") ||
        !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2)
      fail(errc::checkpoint_format, tensor + ": needs dtype, shape and two data_offsets");
    Entry e{.dtype = entry["dtype"].get<std::string>(), .shape = {}, .begin = 0, .end = 0};
    for (const nlohmann::json& d : entry["shape"]) {
      if (!d.is_number_integer())
        fail(errc::checkpoint_format, tensor + ": its shape holds a non-integer");
      e.shape.push_back(d.get<std::int64_t>());
    }
    for (const nlohmann::json& o : entry["data_offsets"])
      if (!o.is_number_unsigned())
        fail(errc::checkpoint_format, tensor + ": its data_offsets are not byte counts");
    e.begin = entry["data_offsets"][0].get<std::uint64_t>();
    e.end = entry["data_offsets"][1].get<std::uint64_t>();
    if (e.begin > e.end || e.end > data_bytes)
      fail(errc::checkpoint_format, tensor + ": bytes " + std::to_string(e.begin) + ".." +
                                        std::to_string(e.end) + " lie outside the file's " +
                                        std::to_string(data_bytes) + " bytes of data");
    entries.emplace(key, std::move(e));
  }
  std::vector<const Entry*> by_offset;
  for (const auto& [key, e] : entries) by_offset.push_back(&e);
  std::ranges::sort(by_offset, {}, &Entry::begin);
  std::uint64_t next = 0;
  for (const Entry* e : by_offset) {
    if (e->begin != next)
      fail(errc::checkpoint_format, name + ": its tensors overlap or leave a hole at byte " +
                                        std::to_string(std::min(e->begin, next)));
    next = e->end;
  }
  if (next != data_bytes)
    fail(errc::checkpoint_format, name + ": bytes " + std::to_string(next) + ".." +
                                      std::to_string(data_bytes) + " belong to no tensor");

  std::set<std::string> listed;
  for (const nn::Parameter& p : tensors) listed.insert(p.name);
  if (!options.skip_unlisted)
    for (const auto& [key, e] : entries)
      if (!listed.contains(key))
        fail(errc::checkpoint_mismatch,
             name + ": holds tensor '" + key +
                 "', which the network does not have (CheckpointLoad::skip_unlisted skips it)");
  std::vector<const Entry*> places;
  for (const nn::Parameter& p : tensors) {
    const auto found = entries.find(p.name);
    if (found == entries.end())
      fail(errc::checkpoint_mismatch, name + ": has no tensor '" + p.name + "'");
    const Entry& e = found->second;
    const std::string tensor = name + ": tensor '" + p.name + "'";
    if (e.dtype != detail::safetensors_dtype(p.tensor->dtype()))
      fail(errc::checkpoint_mismatch, tensor + " is " + e.dtype + ", the network's is " +
                                          detail::safetensors_dtype(p.tensor->dtype()));
    if (!std::equal(e.shape.begin(), e.shape.end(), p.tensor->shape().begin(),
                    p.tensor->shape().end()))
      fail(errc::checkpoint_mismatch, tensor + " has shape " + nlohmann::json(e.shape).dump() +
                                          ", the network's is " + p.tensor->shape().str());
    if (e.end - e.begin != detail::tensor_bytes(*p.tensor))
      fail(errc::checkpoint_format, tensor + ": bytes " + std::to_string(e.begin) + ".." +
                                        std::to_string(e.end) + " do not hold " +
                                        p.tensor->shape().str());
    places.push_back(&e);
  }

  std::vector<std::uint8_t> data(static_cast<std::size_t>(data_bytes));
  if (std::fread(data.data(), 1, data.size(), checked.opened.file.get()) != data.size())
    fail(errc::checkpoint_format, name + ": the file ends inside its data");
  const std::uint32_t crc =
      detail::header_crc(crc32_z(crc32(0L, Z_NULL, 0), data.data(), data.size()), header);
  if (std::to_string(crc) != meta.value(detail::checksum_key, std::string()))
    fail(errc::checkpoint_corrupt,
         name + ": its header and data do not match the CRC-32 in its metadata");
  for (std::size_t i = 0; i < tensors.size(); ++i)
    std::memcpy(tensors[i].tensor->data(), data.data() + places[i]->begin,
                places[i]->end - places[i]->begin);

  return detail::checkpoint_position(name, meta);
}

} // namespace kiln
