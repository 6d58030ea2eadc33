// The command line every kiln program shares: CLI11 with --help on stdout and --version,
// validators that read a whole value and check its range, and one exit path that turns bad
// arguments and kiln errors into a message naming the flag and a non-zero exit code.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include "kiln/core/error.hpp"

#ifndef KILN_VERSION
#error "KILN_VERSION comes from the kiln::tools CMake target"
#endif

namespace kiln::tools {

/// Exit code of a run stopped by a bad argument (as CLI11 and getopt programs use).
inline constexpr int exit_usage = 2;
/// Exit code of a run stopped by any other error.
inline constexpr int exit_failure = 1;

namespace detail {

template <class T> std::string range_text(T lo, T hi) {
  const auto text = [](T v) {
    if constexpr (std::is_floating_point_v<T>) {
      if (v == std::numeric_limits<T>::max()) return std::string("inf");
      if (v == -std::numeric_limits<T>::max()) return std::string("-inf");
      char buffer[32];
      const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, v);
      return ec == std::errc{} ? std::string(buffer, end) : std::string("?");
    } else {
      return std::to_string(v);
    }
  };
  return "[" + text(lo) + ", " + text(hi) + "]";
}

/// Reads all of `text` as a T; the error message is empty when it is one in [lo, hi].
template <class T> std::string check_whole(const std::string& text, T lo, T hi, const char* what) {
  T value{};
  const char* first = text.data();
  const char* last = first + text.size();
  if (std::is_unsigned_v<T> && first != last && *first == '-')
    return "value '" + text + "' is negative";
  const auto [end, ec] = std::from_chars(first, last, value);
  if (ec == std::errc::result_out_of_range)
    return "value '" + text + "' is outside " + range_text(lo, hi);
  if (ec != std::errc{} || end != last || first == last)
    return "value '" + text + "' is not " + what;
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(value)) return "value '" + text + "' is not a finite number";
  if (value < lo || value > hi) return "value " + text + " is outside " + range_text(lo, hi);
  return {};
}

} // namespace detail

/// A whole base-10 integer in [lo, hi].
inline CLI::Validator integer_in(long long lo, long long hi) {
  return {[lo, hi](std::string& text) { return detail::check_whole(text, lo, hi, "an integer"); },
          "INT in " + detail::range_text(lo, hi)};
}

/// A whole base-10 integer that fits in 64 bits unsigned (a seed).
inline CLI::Validator unsigned_integer() {
  return {[](std::string& text) {
            return detail::check_whole<std::uint64_t>(
                text, 0, std::numeric_limits<std::uint64_t>::max(), "a non-negative integer");
          },
          "UINT64"};
}

/// A finite number in [lo, hi].
inline CLI::Validator number_in(double lo, double hi) {
  return {[lo, hi](std::string& text) { return detail::check_whole(text, lo, hi, "a number"); },
          "NUMBER in " + detail::range_text(lo, hi)};
}

/// A finite number greater than zero (a learning rate, a factor).
inline CLI::Validator positive_number() {
  return {[](std::string& text) {
            const double largest = std::numeric_limits<double>::max();
            std::string error = detail::check_whole(text, -largest, largest, "a number");
            if (error.empty() && !(std::stod(text) > 0.0)) error = "value " + text + " is not > 0";
            return error;
          },
          "NUMBER > 0"};
}

/// One of `names`, listed in the message when the value is not.
inline CLI::Validator one_of(std::vector<std::string> names, const std::string& what) {
  return {[names, what](std::string& text) {
            if (std::find(names.begin(), names.end(), text) != names.end()) return std::string();
            std::string known;
            for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
            return "unknown " + what + " '" + text + "' (" + known + ")";
          },
          "NAME"};
}

/// Gives `app` the flags and messages every kiln program shares: --version, defaults shown
/// in --help, and errors prefixed by the program's name.
inline void share_conventions(CLI::App& app) {
  app.set_version_flag("--version", app.get_name() + " (kiln " KILN_VERSION ")");
  app.option_defaults()->always_capture_default();
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    return a->get_name() + ": " + e.what() + "\nRun with --help for more information.\n";
  });
}

/// Parses the command line into `app`'s options and runs `body`. --help and --version print
/// on stdout and exit 0; a bad argument prints its message (naming the flag) and exits
/// exit_usage; a kiln::Error or any other exception from `body` prints and exits non-zero.
template <class Body> int run(CLI::App& app, int argc, char** argv, Body&& body) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : exit_usage;
  }
  const std::string& name = app.get_name();
  try {
    return body();
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
    return e.code() == errc::argument ? exit_usage : exit_failure;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: out of memory\n", name.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
  }
  return exit_failure;
}

} // namespace kiln::tools
