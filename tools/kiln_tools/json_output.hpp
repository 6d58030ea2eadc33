// A program's JSON results file: checked when the program starts, so an unwritable path fails
// before any training or timing, and written once at the end with nlohmann-json, which writes
// NaN and infinity as null.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include "kiln/core/error.hpp"

namespace kiln::tools {

/// Fails with kiln.data.io, naming `flag`, unless `path` can be written; an existing file is
/// left unchanged and a new one is not left behind.
inline void require_writable(const std::string& path, const std::string& flag) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  if (!std::ofstream(path, std::ios::app)) fail(errc::io, flag + ": cannot write '" + path + "'");
  if (!existed) std::filesystem::remove(path, ec);
}

/// The file named by a program's --json flag (none when the flag was not given).
class JsonOutput {
public:
  /// Fails with kiln.data.io now when `path` cannot be written; an existing file is kept
  /// unchanged until write().
  explicit JsonOutput(std::string path) : path_(std::move(path)) {
    if (!path_.empty()) require_writable(path_, "--json");
  }

  [[nodiscard]] bool wanted() const { return !path_.empty(); }

  /// Writes `results`, indented, replacing the file's contents.
  void write(const nlohmann::json& results) const {
    if (path_.empty()) return;
    std::ofstream out(path_, std::ios::trunc);
    out << results.dump(2) << '\n';
    if (!out.flush()) fail(errc::io, "--json: cannot write '" + path_ + "'");
  }

private:
  std::string path_;
};

} // namespace kiln::tools
