// IDX file reader (the MNIST container format), plain or gzip, hardened against bad files.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/shape.hpp"

namespace kiln::data {

/// The contents of an IDX file of unsigned bytes: its dimensions, outermost first, and
/// the row-major payload (`data.size() == dims.numel()`).
struct IdxArray {
  Shape dims;
  std::vector<std::uint8_t> data;
};

/// The largest payload `read_idx` accepts, in bytes. Full MNIST train images are 47 MB, so
/// this only rejects hostile or corrupt headers before they can drive a huge allocation.
inline constexpr std::uint64_t idx_max_payload = std::uint64_t{1} << 31;

namespace detail {

/// A byte source over either a plain file (stdio) or a gzip stream (zlib).
class IdxSource {
public:
  explicit IdxSource(const std::filesystem::path& path) : path_(path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) fail(errc::io, name() + ": is a directory");
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) fail(errc::io, name() + ": cannot open: " + std::strerror(errno));
    file_.reset(f);
    unsigned char head[2] = {0, 0};
    const std::size_t got = std::fread(head, 1, 2, f);
    if (std::ferror(f)) fail(errc::io, name() + ": read error: " + std::strerror(errno));
    gzip_ = got == 2 && head[0] == 0x1f && head[1] == 0x8b;
    if (gzip_) {
      file_.reset();
      gzFile gz = gzopen(path.c_str(), "rb");
      if (!gz) fail(errc::io, name() + ": cannot open gzip stream");
      gz_.reset(gz);
      gzbuffer(gz, 1u << 17);
    } else {
      std::rewind(f);
    }
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) fail(errc::io, name() + ": cannot stat: " + ec.message());
    file_size_ = static_cast<std::uint64_t>(size);
  }

  [[nodiscard]] bool gzip() const { return gzip_; }
  /// Size of the file on disk (compressed size for gzip).
  [[nodiscard]] std::uint64_t file_size() const { return file_size_; }
  [[nodiscard]] std::string name() const { return path_.string(); }

  /// Reads up to `n` bytes; returns how many arrived (fewer only at end of data).
  std::size_t read(void* dst, std::size_t n) {
    auto* out = static_cast<unsigned char*>(dst);
    std::size_t total = 0;
    while (total < n) {
      std::size_t got = 0;
      if (gzip_) {
        // gzread takes an unsigned count, so large requests go in bounded slices.
        const auto want = static_cast<unsigned>(std::min<std::size_t>(n - total, 1u << 30));
        int r = gzread(gz_.get(), out + total, want);
        if (r < 0) {
          gz_error();
          r = 0;
        }
        got = static_cast<std::size_t>(r);
      } else {
        got = std::fread(out + total, 1, n - total, file_.get());
        if (got == 0 && std::ferror(file_.get()))
          fail(errc::io, name() + ": read error: " + std::strerror(errno));
      }
      if (got == 0) {
        // A truncated gzip stream reports Z_BUF_ERROR only via gzerror after a short read.
        if (gzip_) gz_error();
        break;
      }
      total += got;
    }
    return total;
  }

private:
  void gz_error() {
    int code = Z_OK;
    const char* raw = gzerror(gz_.get(), &code);
    if (code == Z_OK || code == Z_BUF_ERROR) return; // Z_BUF_ERROR: stream ended early
    // zlib prefixes its message with the path, which our message already leads with.
    std::string msg = raw ? raw : "unknown zlib error";
    if (const std::string prefix = name() + ": "; msg.rfind(prefix, 0) == 0)
      msg.erase(0, prefix.size());
    if (code == Z_DATA_ERROR) fail(errc::format, name() + ": corrupt gzip data: " + msg);
    fail(errc::io, name() + ": gzip read error: " + msg);
  }

  struct FileClose {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  struct GzClose {
    void operator()(gzFile g) const { gzclose(g); }
  };

  std::filesystem::path path_;
  std::unique_ptr<std::FILE, FileClose> file_;
  std::unique_ptr<gzFile_s, GzClose> gz_;
  std::uint64_t file_size_ = 0;
  bool gzip_ = false;
};

inline std::uint32_t load_be32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

inline std::string hex_byte(unsigned v) {
  static constexpr char digits[] = "0123456789abcdef";
  return std::string("0x") + digits[(v >> 4) & 0xf] + digits[v & 0xf];
}

} // namespace detail

/// Reads an IDX file of unsigned bytes (type 0x08, rank 1..4), plain or gzip-compressed;
/// gzip is recognised by its 1f 8b magic bytes, not by the file name.
///
/// Every header field is validated before the payload is read, and no buffer larger than the
/// data actually present is allocated, so truncated or hostile files are rejected cleanly.
/// Throws kiln::Error naming the file and the field:
///   - errc::io        the file is missing, unreadable or a directory;
///   - errc::magic     the first two bytes are not zero (not an IDX file);
///   - errc::format    element type other than u8, rank outside 1..4, a zero dimension, a
///                     payload above `idx_max_payload`, bytes after the payload, corrupt gzip;
///   - errc::truncated the header or the payload is shorter than the header claims.
inline IdxArray read_idx(const std::filesystem::path& path) {
  detail::IdxSource src(path);
  const std::string name = src.name();

  unsigned char magic[4];
  const std::size_t got_magic = src.read(magic, 4);
  if (got_magic >= 2 && (magic[0] != 0 || magic[1] != 0))
    fail(errc::magic, name + ": not an IDX file (first bytes " + detail::hex_byte(magic[0]) + " " +
                          detail::hex_byte(magic[1]) + ", expected 0x00 0x00)");
  if (got_magic < 4)
    fail(errc::truncated, name + ": " + (src.gzip() ? "gzip stream" : "file") + " holds " +
                              std::to_string(got_magic) +
                              " bytes, shorter than the 4-byte IDX magic");
  if (magic[2] != 0x08)
    fail(errc::format, name + ": element type is " + detail::hex_byte(magic[2]) +
                           ", only 0x08 (unsigned byte) is supported");
  const int rank = magic[3];
  if (rank < 1 || rank > 4)
    fail(errc::format, name + ": rank is " + std::to_string(rank) + ", expected 1..4");

  unsigned char raw_dims[16];
  const std::size_t dims_bytes = 4 * static_cast<std::size_t>(rank);
  const std::size_t got_dims = src.read(raw_dims, dims_bytes);
  if (got_dims < dims_bytes)
    fail(errc::truncated, name + ": header of rank " + std::to_string(rank) + " needs " +
                              std::to_string(4 + dims_bytes) + " bytes, " +
                              (src.gzip() ? "gzip stream" : "file") + " holds " +
                              std::to_string(4 + got_dims) + " bytes");

  const std::string holds =
      src.gzip() ? "gzip file holds " + std::to_string(src.file_size()) + " compressed bytes"
                 : "file holds " + std::to_string(src.file_size()) + " bytes";
  IdxArray out;
  std::uint64_t payload = 1;
  for (int i = 0; i < rank; ++i) {
    const std::uint32_t d = detail::load_be32(raw_dims + 4 * i);
    if (d == 0) fail(errc::format, name + ": dimension " + std::to_string(i) + " is 0");
    // payload <= 2^31 and d < 2^32 before the multiply, so the product cannot overflow.
    payload *= d;
    if (payload > idx_max_payload)
      fail(errc::format, name + ": dimension " + std::to_string(i) + " is " + std::to_string(d) +
                             ", payload exceeds the " + std::to_string(idx_max_payload) +
                             "-byte limit; " + holds);
    out.dims.push_back(d);
  }

  const std::uint64_t header_bytes = 4 + dims_bytes;
  if (!src.gzip()) {
    const std::uint64_t expected = header_bytes + payload;
    if (src.file_size() < expected)
      fail(errc::truncated, name + ": header " + out.dims.str() + " needs " +
                                std::to_string(expected) + " bytes, " + holds);
    if (src.file_size() > expected)
      fail(errc::format, name + ": header " + out.dims.str() + " needs " +
                             std::to_string(expected) + " bytes, " + holds + " (trailing data)");
    out.data.resize(payload);
    if (src.read(out.data.data(), payload) != payload)
      fail(errc::truncated, name + ": file shrank while being read");
    return out;
  }

  // The decompressed size is unknown until read, so the buffer grows with the data that
  // actually arrives instead of trusting the header's claim up front.
  constexpr std::size_t chunk = std::size_t{1} << 20;
  std::size_t have = 0;
  while (have < payload) {
    const std::size_t want = std::min<std::size_t>(chunk, payload - have);
    if (out.data.capacity() < have + want)
      out.data.reserve(
          std::min<std::size_t>(payload, std::max(2 * out.data.capacity(), have + want)));
    out.data.resize(have + want);
    const std::size_t got = src.read(out.data.data() + have, want);
    have += got;
    if (got < want)
      fail(errc::truncated, name + ": header " + out.dims.str() + " needs " +
                                std::to_string(payload) + " payload bytes, gzip stream holds " +
                                std::to_string(have) + " bytes");
  }
  unsigned char extra;
  if (src.read(&extra, 1) != 0)
    fail(errc::format, name + ": trailing data after the " + std::to_string(payload) +
                           "-byte payload of " + out.dims.str());
  return out;
}

} // namespace kiln::data
