// A fuzz input as a regular file that kiln's readers open by path: an in-memory file
// (memfd), rewritten for every input, so that fuzzing never touches the disk.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace kiln::fuzz {

/// The path of a regular in-memory file holding `data`; valid until the next call.
inline std::string as_file(const std::uint8_t* data, std::size_t size) {
  static const int fd = [] {
    const int f = ::memfd_create("kiln-fuzz-input", MFD_CLOEXEC);
    if (f < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    return f;
  }();
  if (::ftruncate(fd, 0) != 0 ||
      (size > 0 && ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size))) {
    std::perror("writing the fuzz input");
    std::abort();
  }
  return "/proc/self/fd/" + std::to_string(fd);
}

} // namespace kiln::fuzz
