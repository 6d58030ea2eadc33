// Pictures through the tools a machine set up by scripts/install_deps.sh has: Graphviz's dot
// for graphs and gnuplot for charts, both fed on stdin and writing SVG.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <string_view>

#include "kiln/core/error.hpp"

namespace kiln::tools {

/// Whether `program` is an executable file in one of $PATH's directories.
inline bool on_path(std::string_view program) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && access((dir + "/" + std::string(program)).c_str(), X_OK) == 0) return true;
  return false;
}

/// Fails with kiln.api.argument, naming `flag` and the Debian package, unless `program`
/// can run; called before any work so that a missing renderer costs nothing.
inline void require_program(std::string_view program, std::string_view package,
                            std::string_view flag) {
  if (!on_path(program))
    fail(errc::argument, std::string(flag) + " needs '" + std::string(program) +
                             "', which is not installed (apt-get install " + std::string(package) +
                             ", or run scripts/install_deps.sh as root)");
}

/// Whether `path` names an SVG file.
inline bool is_svg(const std::string& path) {
  return std::filesystem::path(path).extension() == ".svg";
}

/// `text` quoted for a POSIX shell.
inline std::string shell_quoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

/// Runs `command` (a shell command line) with `input` on its stdin; fails with kiln.data.io
/// naming `what` when it cannot start or does not exit with 0.
inline void pipe_into(const std::string& command, const std::string& input, const char* what) {
  std::FILE* pipe = popen(command.c_str(), "w");
  if (!pipe) fail(errc::io, std::string(what) + ": cannot start '" + command + "'");
  const bool written = std::fwrite(input.data(), 1, input.size(), pipe) == input.size();
  const int status = pclose(pipe);
  if (!written || status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail(errc::io, std::string(what) + ": '" + command + "' failed");
}

/// Renders Graphviz text `dot` as the SVG file `path`.
inline void render_dot_svg(const std::string& dot, const std::string& path) {
  pipe_into("dot -Tsvg -o " + shell_quoted(path), dot, "--dot");
}

/// A gnuplot string literal holding `text`.
inline std::string gnuplot_quoted(const std::string& text) {
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

/// Runs gnuplot `script` after setting its output to an SVG file `path` of `width` x `height`.
inline void plot_svg(const std::string& script, const std::string& path, const char* what,
                     int width = 760, int height = 420) {
  pipe_into("gnuplot",
            "set terminal svg size " + std::to_string(width) + "," + std::to_string(height) +
                " dynamic noenhanced font 'sans,12'\nset output " + gnuplot_quoted(path) + "\n" +
                script,
            what);
}

} // namespace kiln::tools
