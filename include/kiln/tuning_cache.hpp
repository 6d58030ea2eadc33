// The tuning cache: what a tuner measured, kept in a JSON file by machine, target, thread count
// and graph, so that compiling the same step again on the same machine reads its decisions back
// instead of measuring again. It also keeps each machine's measured peak.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include "kiln/core/fnv1a.hpp"
#include "kiln/core/regular_file.hpp"
#include "kiln/ir/printer.hpp"
#include "kiln/passes/cost_model.hpp"
#include "kiln/passes/decisions.hpp"
#include "kiln/passes/report.hpp"

namespace kiln {

/// The processor's model name ("AMD EPYC 9R14", from /proc/cpuinfo), or "unknown cpu".
inline std::string cpu_model_name() {
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (!line.starts_with("model name")) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) break;
    const auto start = line.find_first_not_of(' ', colon + 1);
    return start == std::string::npos ? "unknown cpu" : line.substr(start);
  }
  return "unknown cpu";
}

/// 16 hex digits of the FNV-1a hash of the graph's text: its ops, attributes, shapes and
/// outputs, not its parameters' values.
inline std::string graph_fingerprint(const Graph& g) {
  const std::string text = to_text(g);
  const std::uint64_t h = fnv1a(text.data(), text.size());
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

/// Where a tuning cache lives unless CompileOptions::tune_cache says: $KILN_TUNING_CACHE, else
/// $XDG_CACHE_HOME/kiln/tuning.json, else $HOME/.cache/kiln/tuning.json; empty (no cache)
/// when none of them is set.
inline std::filesystem::path default_tuning_cache() {
  if (const char* file = std::getenv("KILN_TUNING_CACHE"); file && *file) return file;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::filesystem::path(xdg) / "kiln" / "tuning.json";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::filesystem::path(home) / ".cache" / "kiln" / "tuning.json";
  return {};
}

/// What one tuning found: the choices to force and the report that explains them.
struct TuningEntry {
  Decisions decisions;
  TuningReport report;
};

namespace detail {

inline nlohmann::json to_json(const TuningEntry& e) {
  nlohmann::json decisions = nlohmann::json::array();
  for (const TunedDecision& d : e.report.decisions) {
    nlohmann::json candidates = nlohmann::json::array();
    for (const TuningCandidate& c : d.candidates)
      candidates.push_back(
          {{"choice", c.choice}, {"predicted_ms", c.predicted_ms}, {"measured_ms", c.measured_ms}});
    decisions.push_back({{"key", d.key},
                         {"description", d.description},
                         {"rule", d.rule},
                         {"chosen", d.chosen},
                         {"candidates", candidates}});
  }
  return {{"choices", e.decisions.choices}, {"note", e.report.note},
          {"seconds", e.report.seconds},    {"rules_ms", e.report.rules_ms},
          {"tuned_ms", e.report.tuned_ms},  {"decisions", decisions}};
}

/// The entry stored as `j`; throws nlohmann::json's exceptions where a field is missing or of
/// another type.
inline TuningEntry entry_from_json(const nlohmann::json& j) {
  TuningEntry e;
  for (const auto& [key, choice] : j.at("choices").items())
    e.decisions.choices.emplace(key, choice.get<std::string>());
  e.report.note = j.at("note").get<std::string>();
  e.report.seconds = j.at("seconds").get<double>();
  e.report.rules_ms = j.at("rules_ms").get<double>();
  e.report.tuned_ms = j.at("tuned_ms").get<double>();
  for (const nlohmann::json& d : j.at("decisions")) {
    TunedDecision decision{d.at("key").get<std::string>(),
                           d.at("description").get<std::string>(),
                           d.at("rule").get<std::string>(),
                           d.at("chosen").get<std::string>(),
                           {}};
    for (const nlohmann::json& c : d.at("candidates"))
      decision.candidates.push_back({c.at("choice").get<std::string>(),
                                     c.at("predicted_ms").get<double>(),
                                     c.at("measured_ms").get<double>()});
    e.report.decisions.push_back(std::move(decision));
  }
  return e;
}

} // namespace detail

/// A tuning cache file: entries by TuningCache::key, peaks by machine. Reading never throws: a
/// file that is missing is empty, and a file that is not a kiln tuning cache is left alone
/// (problem() says why, and store() will not write over it), so a cache can never cost a
/// compilation or someone's file.
class TuningCache {
public:
  static constexpr const char* format = "kiln.tuning.v1";

  /// Reads `path` (nothing when empty: no cache).
  explicit TuningCache(std::filesystem::path path) : path_(std::move(path)) {
    data_ = {{"format", format},
             {"peaks", nlohmann::json::object()},
             {"entries", nlohmann::json::object()}};
    if (path_.empty()) return;
    std::error_code ec;
    if (!std::filesystem::exists(path_, ec)) return;
    try {
      const RegularFile file = open_regular_file(path_, errc::io);
      std::string text(static_cast<std::size_t>(file.size), '\0');
      if (std::fread(text.data(), 1, text.size(), file.file.get()) != text.size())
        fail(errc::io, path_.string() + ": cannot read it whole");
      const nlohmann::json j = nlohmann::json::parse(text);
      if (!j.is_object() || j.value("format", "") != format)
        fail(errc::format, "it has no \"format\": \"" + std::string(format) + "\"");
      if (!j.at("peaks").is_object() || !j.at("entries").is_object())
        fail(errc::format, "\"peaks\" and \"entries\" must be objects");
      data_ = j;
    } catch (const std::exception& e) {
      problem_ = "the tuning cache " + path_.string() +
                 " is not a kiln tuning cache, so it was neither read nor written (" + e.what() +
                 ")";
    }
  }

  /// The key of one tuning: machine, backend, instruction set, workers, graph, passes off.
  [[nodiscard]] static std::string key(const Target& target, int threads, const Graph& graph,
                                       const std::string& disabled,
                                       Precision precision = Precision::f32) {
    return machine_key(target, threads) + " | graph " + graph_fingerprint(graph) + " | off [" +
           disabled + "]" +
           (precision == Precision::f32 ? "" : " | " + std::string(precision_name(precision)));
  }
  /// The key of one machine's peak: processor, backend, instruction set, workers.
  [[nodiscard]] static std::string machine_key(const Target& target, int threads) {
    return cpu_model_name() + " | " + target.backend + " " + target.isa + " | " +
           std::to_string(threads) + " threads";
  }

  [[nodiscard]] std::optional<TuningEntry> find(const std::string& key) const {
    const nlohmann::json& entries = data_.at("entries");
    const auto it = entries.find(key);
    if (it == entries.end()) return std::nullopt;
    try {
      return detail::entry_from_json(*it);
    } catch (const nlohmann::json::exception&) {
      return std::nullopt; // an entry of another shape: tuned again, and replaced
    }
  }
  [[nodiscard]] std::optional<MachinePeak> peak(const std::string& machine, int threads) const {
    const nlohmann::json& peaks = data_.at("peaks");
    const auto it = peaks.find(machine);
    if (it == peaks.end()) return std::nullopt;
    try {
      return MachinePeak{threads, it->at("gflops").get<double>(),
                         it->at("gbytes_per_s").get<double>(),
                         it->at("cache_gbytes_per_s").get<double>()};
    } catch (const nlohmann::json::exception&) {
      return std::nullopt;
    }
  }

  void set(const std::string& key, const TuningEntry& entry) {
    data_["entries"][key] = detail::to_json(entry);
  }
  void set_peak(const std::string& machine, const MachinePeak& p) {
    data_["peaks"][machine] = {{"gflops", p.gflops},
                               {"gbytes_per_s", p.gbytes_per_s},
                               {"cache_gbytes_per_s", p.cache_gbytes_per_s}};
  }

  /// Writes the cache: to a temporary file beside it, renamed over it, so that a reader sees
  /// the old file or the new one. Returns "" or why it could not (a cache that cannot be
  /// written costs the next compilation a tuning, not this one its result).
  [[nodiscard]] std::string store() const {
    if (path_.empty()) return "";
    if (!problem_.empty()) return problem_;
    std::error_code ec;
    if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path(), ec);
    if (ec)
      return "cannot create the folder of the tuning cache " + path_.string() + ": " + ec.message();
    const std::filesystem::path temporary =
        path_.string() + ".tmp" + std::to_string(static_cast<long long>(::getpid()));
    {
      std::ofstream out(temporary, std::ios::trunc);
      out << data_.dump(1) << "\n";
      if (!out.flush()) {
        std::filesystem::remove(temporary, ec);
        return "cannot write the tuning cache " + temporary.string();
      }
    }
    std::filesystem::rename(temporary, path_, ec);
    if (ec) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      return "cannot rename " + temporary.string() + " over the tuning cache: " + ec.message();
    }
    return "";
  }

  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  /// Why the file could not be used ("" when it could).
  [[nodiscard]] const std::string& problem() const { return problem_; }

private:
  std::filesystem::path path_;
  nlohmann::json data_;
  std::string problem_;
};

} // namespace kiln
