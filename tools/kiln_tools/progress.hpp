// Progress of a long loop: on a terminal a bar redrawn in place with the rate and the time
// left; when the output is a pipe or a file, one line every few seconds.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace kiln::tools {

/// Reports `total` units of work (steps) on `out`, each worth `items_per_unit` items (images)
/// for the rate.
class Progress {
public:
  Progress(std::FILE* out, std::int64_t total, std::int64_t items_per_unit,
           std::chrono::duration<double> line_interval = std::chrono::seconds(5))
      : out_(out), total_(std::max<std::int64_t>(total, 1)), items_per_unit_(items_per_unit),
        tty_(isatty(fileno(out)) != 0), line_interval_(line_interval), start_(clock::now()),
        last_(start_) {}

  /// `done` units finished; `detail` is shown after the counts (the running loss).
  void update(std::int64_t done, const std::string& detail) {
    const auto now = clock::now();
    const bool last_unit = done >= total_;
    if (!last_unit && now - last_ < (tty_ ? redraw_interval : line_interval_)) return;
    last_ = now;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double rate = seconds > 0 ? static_cast<double>(done * items_per_unit_) / seconds : 0;
    const double left =
        done > 0 ? seconds * static_cast<double>(total_ - done) / static_cast<double>(done) : 0;
    if (tty_) {
      constexpr int width = 24;
      const auto filled = static_cast<int>(width * done / total_);
      std::fprintf(out_, "\r  [%s%s] %lld/%lld  %s  %.0f/s  %s left ",
                   std::string(static_cast<std::size_t>(filled), '=').c_str(),
                   std::string(static_cast<std::size_t>(width - filled), ' ').c_str(),
                   static_cast<long long>(done), static_cast<long long>(total_), detail.c_str(),
                   rate, clock_text(left).c_str());
    } else if (!last_unit) {
      std::fprintf(out_, "  %lld/%lld  %s  %.0f/s  %s left\n", static_cast<long long>(done),
                   static_cast<long long>(total_), detail.c_str(), rate, clock_text(left).c_str());
    }
    std::fflush(out_);
  }

  /// Clears the bar, so that the next line starts clean.
  void finish() {
    if (tty_) std::fprintf(out_, "\r%100s\r", "");
    std::fflush(out_);
  }

private:
  using clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds redraw_interval{100};

  static std::string clock_text(double seconds) {
    const auto s = static_cast<long long>(seconds + 0.5);
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%lld:%02lld", s / 60, s % 60);
    return buffer;
  }

  std::FILE* out_;
  std::int64_t total_, items_per_unit_;
  bool tty_;
  std::chrono::duration<double> line_interval_;
  clock::time_point start_, last_;
};

} // namespace kiln::tools
