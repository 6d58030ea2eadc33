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
#include "kiln/core/regular_file.hpp"
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

/// A byte source over either a plain file or a single gzip member (inflated with zlib here, so
/// that a stream cut before its trailer, or followed by anything, is an error). Only regular
/// files are opened: a FIFO or a device would block or never end.
class IdxSource {
public:
  explicit IdxSource(const std::filesystem::path& path) : path_(path) {
    RegularFile opened = open_regular_file(path, errc::io);
    file_size_ = opened.size;
    file_ = std::move(opened.file);
    std::FILE* f = file_.get();
    unsigned char head[2] = {0, 0};
    const std::size_t got = std::fread(head, 1, 2, f);
    if (std::ferror(f)) fail(errc::io, name() + ": read error: " + std::strerror(errno));
    std::rewind(f);
    gzip_ = got == 2 && head[0] == 0x1f && head[1] == 0x8b;
    if (gzip_) {
      stream_ = std::make_unique<z_stream>();
      if (inflateInit2(stream_.get(), 16 + MAX_WBITS) != Z_OK)
        fail(errc::io, name() + ": cannot start a gzip stream");
      input_.resize(std::size_t{1} << 17);
    }
  }
  IdxSource(const IdxSource&) = delete;
  IdxSource& operator=(const IdxSource&) = delete;
  ~IdxSource() {
    if (stream_) inflateEnd(stream_.get());
  }

  [[nodiscard]] bool gzip() const { return gzip_; }
  /// Size of the file on disk (compressed size for gzip).
  [[nodiscard]] std::uint64_t file_size() const { return file_size_; }
  [[nodiscard]] std::string name() const { return path_.string(); }

  /// Reads up to `n` bytes; returns how many arrived (fewer only at end of data).
  std::size_t read(void* dst, std::size_t n) {
    auto* out = static_cast<unsigned char*>(dst);
    if (gzip_) return inflate_into(out, n);
    std::size_t total = 0;
    while (total < n) {
      const std::size_t got = std::fread(out + total, 1, n - total, file_.get());
      if (got == 0 && std::ferror(file_.get()))
        fail(errc::io, name() + ": read error: " + std::strerror(errno));
      if (got == 0) break;
      total += got;
    }
    return total;
  }

  /// After the last byte was read: a gzip stream must have ended with its trailer (whose CRC
  /// and length zlib has checked), with nothing after it.
  void expect_end() {
    if (!gzip_) return;
    if (!ended_)
      fail(errc::truncated, name() + ": the gzip stream is cut off before its trailer, so its "
                                     "CRC cannot be checked");
    const bool more = stream_->avail_in > 0 || std::fread(input_.data(), 1, 1, file_.get()) > 0;
    if (more) fail(errc::format, name() + ": data after the end of the gzip stream");
  }

private:
  std::size_t inflate_into(unsigned char* out, std::size_t n) {
    std::size_t total = 0;
    while (total < n && !ended_) {
      if (stream_->avail_in == 0) {
        const std::size_t got = std::fread(input_.data(), 1, input_.size(), file_.get());
        if (got == 0 && std::ferror(file_.get()))
          fail(errc::io, name() + ": read error: " + std::strerror(errno));
        if (got == 0) break; // the file ended before the stream did
        stream_->next_in = input_.data();
        stream_->avail_in = static_cast<uInt>(got);
      }
      const auto want = static_cast<uInt>(std::min<std::size_t>(n - total, 1u << 30));
      stream_->next_out = out + total;
      stream_->avail_out = want;
      const int result = inflate(stream_.get(), Z_NO_FLUSH);
      total += want - stream_->avail_out;
      if (result == Z_STREAM_END)
        ended_ = true;
      else if (result == Z_DATA_ERROR || result == Z_NEED_DICT)
        fail(errc::format, name() + ": corrupt gzip data: " +
                               (stream_->msg ? stream_->msg : "invalid deflate stream"));
      else if (result == Z_MEM_ERROR)
        fail(errc::io, name() + ": zlib ran out of memory");
    }
    return total;
  }

  std::filesystem::path path_;
  std::unique_ptr<std::FILE, RegularFile::Close> file_;
  std::unique_ptr<z_stream> stream_;
  std::vector<unsigned char> input_;
  std::uint64_t file_size_ = 0;
  bool gzip_ = false;
  bool ended_ = false;
};

inline std::uint32_t load_be32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

inline std::string hex_byte(unsigned v) {
  static constexpr char digits[] = "0123456789abcdef";
  return std::string("0x") + digits[(v >> 4) & 0xf] + digits[v & 0xf];
}

/// Reserves room for `count` elements in `v` (untouched until written), or fails with
/// kiln.memory.host naming the bytes and the file they were for.
template <class T>
void reserve_or_fail(std::vector<T>& v, std::uint64_t count, const std::filesystem::path& file) {
  try {
    v.reserve(static_cast<std::size_t>(count));
  } catch (const std::bad_alloc&) {
    fail(errc::memory, file.string() + ": cannot allocate " + std::to_string(count * sizeof(T)) +
                           " bytes for its payload");
  } catch (const std::length_error&) {
    fail(errc::memory, file.string() + ": cannot allocate " + std::to_string(count * sizeof(T)) +
                           " bytes for its payload");
  }
}

} // namespace detail

/// An IDX file of unsigned bytes (type 0x08, rank 1..4), plain or gzip-compressed, whose header
/// is read and validated on construction and whose payload is then handed over in pieces, so a
/// caller can convert it without holding all of it. gzip is recognised by its 1f 8b magic
/// bytes, not by the file name. A payload larger than `max_payload` bytes (decompressed) is
/// refused before it is read.
///
/// Throws kiln::Error naming the file and the field:
///   - errc::io        the file is missing, unreadable, a directory or not a regular file;
///   - errc::magic     the first two bytes are not zero (not an IDX file);
///   - errc::format    element type other than u8, rank outside 1..4, a zero dimension, a
///                     payload above `max_payload`, bytes after the payload or after the gzip
///                     stream, corrupt gzip (a CRC or length that does not match included);
///   - errc::truncated the header or the payload is shorter than the header claims, or the
///                     gzip stream ends before its trailer.
class IdxReader {
public:
  explicit IdxReader(const std::filesystem::path& path, std::uint64_t max_payload = idx_max_payload)
      : src_(path), name_(src_.name()) {
    unsigned char magic[4];
    const std::size_t got_magic = src_.read(magic, 4);
    if (got_magic >= 2 && (magic[0] != 0 || magic[1] != 0))
      fail(errc::magic, name_ + ": not an IDX file (first bytes " + detail::hex_byte(magic[0]) +
                            " " + detail::hex_byte(magic[1]) + ", expected 0x00 0x00)");
    if (got_magic < 4)
      fail(errc::truncated, name_ + ": " + (src_.gzip() ? "gzip stream" : "file") + " holds " +
                                std::to_string(got_magic) +
                                " bytes, shorter than the 4-byte IDX magic");
    if (magic[2] != 0x08)
      fail(errc::format, name_ + ": element type is " + detail::hex_byte(magic[2]) +
                             ", only 0x08 (unsigned byte) is supported");
    const int rank = magic[3];
    if (rank < 1 || rank > 4)
      fail(errc::format, name_ + ": rank is " + std::to_string(rank) + ", expected 1..4");

    unsigned char raw_dims[16];
    const std::size_t dims_bytes = 4 * static_cast<std::size_t>(rank);
    const std::size_t got_dims = src_.read(raw_dims, dims_bytes);
    if (got_dims < dims_bytes)
      fail(errc::truncated, name_ + ": header of rank " + std::to_string(rank) + " needs " +
                                std::to_string(4 + dims_bytes) + " bytes, " +
                                (src_.gzip() ? "gzip stream" : "file") + " holds " +
                                std::to_string(4 + got_dims) + " bytes");
    for (int i = 0; i < rank; ++i) {
      const std::uint32_t d = detail::load_be32(raw_dims + 4 * i);
      if (d == 0) fail(errc::format, name_ + ": dimension " + std::to_string(i) + " is 0");
      // payload <= max_payload and d < 2^32 before the multiply; a cap above 2^32 could
      // overflow, so the product is checked by division.
      if (payload_ > max_payload / d)
        fail(errc::format, name_ + ": dimension " + std::to_string(i) + " is " + std::to_string(d) +
                               ", payload exceeds the " + std::to_string(max_payload) +
                               "-byte limit; " + holds());
      payload_ *= d;
      dims_.push_back(d);
    }
    if (!src_.gzip()) {
      const std::uint64_t expected = 4 + dims_bytes + payload_;
      if (src_.file_size() < expected)
        fail(errc::truncated, name_ + ": header " + dims_.str() + " needs " +
                                  std::to_string(expected) + " bytes, " + holds());
      if (src_.file_size() > expected)
        fail(errc::format, name_ + ": header " + dims_.str() + " needs " +
                               std::to_string(expected) + " bytes, " + holds() +
                               " (trailing data)");
    }
  }

  /// The dimensions, outermost first.
  [[nodiscard]] const Shape& dims() const { return dims_; }
  /// Payload bytes the header announces (the product of the dimensions).
  [[nodiscard]] std::uint64_t payload_bytes() const { return payload_; }
  [[nodiscard]] const std::string& name() const { return name_; }

  /// Calls take(bytes, count) for consecutive pieces of the payload (at most 1 MiB each) until
  /// all of it arrived, then checks that nothing follows it and that a gzip stream ended with
  /// a valid trailer. Memory grows only with the data that actually arrives.
  template <class Take> void read_payload(Take&& take) {
    constexpr std::size_t chunk = std::size_t{1} << 20;
    std::vector<unsigned char> piece(
        static_cast<std::size_t>(std::min<std::uint64_t>(chunk, payload_)));
    std::uint64_t have = 0;
    while (have < payload_) {
      const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, payload_ - have));
      const std::size_t got = src_.read(piece.data(), want);
      if (got < want)
        fail(errc::truncated, name_ + ": header " + dims_.str() + " needs " +
                                  std::to_string(payload_) + " payload bytes, " +
                                  (src_.gzip() ? "gzip stream holds " : "file shrank to ") +
                                  std::to_string(have + got) + " bytes");
      take(static_cast<const std::uint8_t*>(piece.data()), got);
      have += got;
    }
    unsigned char extra;
    if (src_.read(&extra, 1) != 0)
      fail(errc::format, name_ + ": trailing data after the " + std::to_string(payload_) +
                             "-byte payload of " + dims_.str());
    src_.expect_end();
  }

private:
  [[nodiscard]] std::string holds() const {
    return src_.gzip() ? "gzip file holds " + std::to_string(src_.file_size()) + " compressed bytes"
                       : "file holds " + std::to_string(src_.file_size()) + " bytes";
  }

  detail::IdxSource src_;
  std::string name_;
  Shape dims_;
  std::uint64_t payload_ = 1;
};

/// Reads a whole IDX file of unsigned bytes into memory; see IdxReader for what is checked
/// and thrown.
inline IdxArray read_idx(const std::filesystem::path& path,
                         std::uint64_t max_payload = idx_max_payload) {
  IdxReader reader(path, max_payload);
  IdxArray out{reader.dims(), {}};
  detail::reserve_or_fail(out.data, reader.payload_bytes(), path);
  reader.read_payload([&](const std::uint8_t* bytes, std::size_t n) {
    out.data.insert(out.data.end(), bytes, bytes + n);
  });
  return out;
}

} // namespace kiln::data
