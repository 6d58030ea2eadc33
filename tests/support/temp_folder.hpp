// A folder of a test's own under the system's temporary directory, removed when it goes.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace kiln::test {

/// `<temp>/<prefix>-<pid>`, created empty and removed with everything in it afterwards.
struct TempFolder {
  std::filesystem::path path;
  explicit TempFolder(const std::string& prefix)
      : path(std::filesystem::temp_directory_path() / (prefix + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  ~TempFolder() { std::filesystem::remove_all(path); }
};

} // namespace kiln::test
