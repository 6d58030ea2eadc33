// Opening a file to read only when it is a regular file, checked on the opened descriptor: a
// FIFO, socket or device would block the open or never end, and a check of the path before the
// open could see another file than the one opened.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "kiln/core/error.hpp"

namespace kiln {

/// A regular file open for reading, and its size when it was opened.
struct RegularFile {
  struct Close {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Close> file;
  std::uint64_t size = 0;
};

/// Opens `path` without blocking; anything but a readable regular file is a kiln::Error with
/// `code`, naming the path and what it is.
inline RegularFile open_regular_file(const std::filesystem::path& path, std::string_view code) {
  const std::string name = path.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(code, name + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool directory = S_ISDIR(st.st_mode);
    ::close(fd);
    fail(code, name + (directory ? ": is a directory"
                                 : ": is not a regular file (a FIFO, socket or device)"));
  }
  std::FILE* f = ::fdopen(fd, "rb");
  if (!f) {
    ::close(fd);
    fail(code, name + ": cannot open: " + std::strerror(errno));
  }
  return {std::unique_ptr<std::FILE, RegularFile::Close>(f),
          static_cast<std::uint64_t>(st.st_size)};
}

} // namespace kiln
