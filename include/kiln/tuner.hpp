// The tuner behind CompileOptions::tune: for each decision a pass makes by rule (a group's
// layout, an epilogue's fusion), it predicts both choices with the cost model, times the ones
// the model cannot settle on the real shapes, keeps what ran faster, checks the whole tuned step
// against the rules' step, and caches the result per machine and graph.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/rng.hpp"
#include "kiln/ir/printer.hpp"
#include "kiln/passes/decisions.hpp"
#include "kiln/passes/report.hpp"
#include "kiln/runtime/executor.hpp"
#include "kiln/runtime/profiler.hpp"
#include "kiln/tuning_cache.hpp"

namespace kiln {

/// Whether compile() measures its decisions (CompileOptions::tune).
enum class Tune : std::uint8_t {
  off,   ///< the passes' rules decide everything
  quick, ///< time the decisions the cost model cannot settle, within a cap of seconds
};

/// A graph optimised with some decisions and lowered, not yet opened on a device.
struct Lowered {
  Plan plan;
  CompileReport report;
};

/// What the tuner needs besides the two steps of compilation.
struct TunerSettings {
  double seconds = 2.0;        ///< the most it may spend, measuring the peak included
  std::filesystem::path cache; ///< the cache file; empty: none
  std::string key;             ///< TuningCache::key of this compilation
  std::string machine_key;     ///< TuningCache::machine_key of this compilation
};

namespace tuning_detail {

using Clock = std::chrono::steady_clock;

/// A kernel as two plans of one graph may both run it: its variant, attributes and shapes.
inline std::string kernel_signature(const PlanStep& s) {
  std::string sig = s.kernel_name;
  sig += std::visit([](const auto& a) { return detail::attr_text(a); }, s.attrs);
  for (int i = 0; i < s.num_inputs; ++i)
    sig += " " + s.inputs[static_cast<std::size_t>(i)].shape.str();
  return sig + " -> " + s.output.shape.str();
}

/// The steps of each plan that the other does not run (matched by signature, as multisets):
/// what a decision changes. Kernels both run cancel out of any comparison of the two.
struct Difference {
  std::vector<std::size_t> only_a, only_b;
};

inline Difference differing_steps(const Plan& a, const Plan& b) {
  std::map<std::string, std::vector<std::size_t>> unmatched_a;
  for (std::size_t i = 0; i < a.steps.size(); ++i)
    unmatched_a[kernel_signature(a.steps[i])].push_back(i);
  Difference d;
  for (std::size_t i = 0; i < b.steps.size(); ++i) {
    auto it = unmatched_a.find(kernel_signature(b.steps[i]));
    if (it == unmatched_a.end() || it->second.empty()) {
      d.only_b.push_back(i);
    } else {
      it->second.pop_back();
    }
  }
  for (const auto& [sig, steps] : unmatched_a)
    d.only_a.insert(d.only_a.end(), steps.begin(), steps.end());
  return d;
}

inline double predicted_seconds(const Plan& plan, const std::vector<std::size_t>& steps,
                                const CostModel& model) {
  double total = 0.0;
  for (std::size_t i : steps) total += model.seconds(step_work(plan, plan.steps[i]));
  return total;
}

/// Feeds every input of the executor's plan the same made-up batch: values in [0, 1), and
/// labels spread over their classes. Timing does not depend on the values.
inline void feed_made_up_inputs(Executor& exe) {
  Rng rng(0x7e57);
  for (const PlanInput& in : exe.plan().inputs) {
    const auto n = static_cast<std::size_t>(in.buffer.shape.numel());
    if (in.buffer.dtype == DType::i32) {
      std::vector<std::int32_t> labels(n);
      for (std::size_t i = 0; i < n; ++i)
        labels[i] = in.label_classes > 0
                        ? static_cast<std::int32_t>(static_cast<std::int64_t>(i) % in.label_classes)
                        : 0;
      exe.set_input(in.name, labels);
    } else {
      std::vector<float> values(n);
      for (float& v : values) v = rng.uniform(0.0f, 1.0f);
      exe.set_input(in.name, values);
    }
  }
}

/// Seconds of one run of each step (the executor profiles).
inline std::vector<double> profiled_run(Executor& exe) {
  const std::vector<StepTime> before = exe.step_times();
  exe.run();
  exe.device().synchronize();
  const std::vector<StepTime> after = exe.step_times();
  std::vector<double> seconds(after.size());
  for (std::size_t i = 0; i < after.size(); ++i) seconds[i] = after[i].seconds - before[i].seconds;
  return seconds;
}

/// Seconds of one whole run.
inline double timed_run(Executor& exe) {
  Device& device = exe.device();
  device.synchronize();
  const double t0 = device.seconds();
  exe.run();
  device.synchronize();
  return device.seconds() - t0;
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

/// The median of a[i] / b[i]: two alternating measurements compared run by run, so that the
/// machine's speed changing between runs (a virtual machine's cores moved apart) cancels out.
/// A run of b that took no time makes a[i] infinitely slower, or equal if it took none either;
/// no runs compare as equal.
inline double median_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> ratios;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    ratios.push_back(b[i] > 0.0   ? a[i] / b[i]
                     : a[i] > 0.0 ? std::numeric_limits<double>::infinity()
                                  : 1.0);
  return ratios.empty() ? 1.0 : median(std::move(ratios));
}

/// The parameters' values before tuning, put back after it: tuning runs training steps on
/// made-up data, and must leave the model as it found it.
class ParamSnapshot {
public:
  explicit ParamSnapshot(const std::vector<std::shared_ptr<Tensor>>& params) : params_(params) {
    for (const auto& t : params_) {
      const auto* p = static_cast<const std::byte*>(t->data());
      saved_.emplace_back(p, p + static_cast<std::size_t>(t->numel()) * dtype_size(t->dtype()));
    }
  }
  void restore() const {
    for (std::size_t i = 0; i < params_.size(); ++i)
      std::memcpy(params_[i]->data(), saved_[i].data(), saved_[i].size());
  }

private:
  std::vector<std::shared_ptr<Tensor>> params_;
  std::vector<std::vector<std::byte>> saved_;
};

/// One decision the tuner may flip: its key, the rule's choice and the other one.
struct Candidate {
  std::string key, description, rule, other;
};

/// The decisions of `report` a measurement could change: the layout of every group that has
/// column matrices to save, and every epilogue the rule fused.
inline std::vector<Candidate> layout_candidates(const CompileReport& report) {
  std::vector<Candidate> out;
  for (const LayoutDecision& d : report.layouts) {
    if (d.saved_bytes <= 0 || d.values.empty()) continue;
    const ValueId first = d.values.front();
    out.push_back({layout_decision_key(first),
                   "the layout of %" + std::to_string(first) + "'s group (" +
                       std::to_string(d.values.size()) +
                       (d.values.size() == 1 ? " value)" : " values)"),
                   d.layout, d.layout == "NHWC" ? "NCHW" : "NHWC"});
  }
  return out;
}

inline std::vector<Candidate> epilogue_candidates(const CompileReport& report) {
  std::vector<Candidate> out;
  for (const FusionDecision& d : report.fusion) {
    if (d.pass != "fuse_epilogue" || d.reason != FusionReason::fused) continue;
    out.push_back({epilogue_decision_key(d.producer, d.consumer),
                   d.producer_op + " %" + std::to_string(d.producer) + " with its consumer " +
                       d.consumer_op + " %" + std::to_string(d.consumer),
                   "fuse", "apart"});
  }
  return out;
}

/// Every convolution the winograd pass weighed: Winograd or direct.
inline std::vector<Candidate> algorithm_candidates(const CompileReport& report) {
  std::vector<Candidate> out;
  for (const AlgorithmDecision& d : report.algorithms)
    out.push_back({algorithm_decision_key(d.node),
                   "how " + d.op + " %" + std::to_string(d.node) + " multiplies", d.algorithm,
                   d.algorithm == "winograd" ? "direct" : "winograd"});
  return out;
}

/// A tuning in progress: the executors, the clock and what was found so far.
class Tuner {
public:
  using LowerFn = std::function<Lowered(const Decisions&)>;
  using OpenFn = std::function<Executor(Lowered)>;

  /// `start`: when the tuning began; the cap counts from there.
  Tuner(const TunerSettings& settings, LowerFn lower, OpenFn open, Clock::time_point start)
      : settings_(settings), lower_(std::move(lower)), open_(std::move(open)), start_(start) {}

  /// Tunes, restores the parameters, and returns the decisions with their report.
  TuningEntry run(const Lowered& rules, const MachinePeak& peak) {
    model_ = CostModel{peak};
    const ParamSnapshot snapshot(rules.plan.params);
    try {
      current_ = rules;
      open_current();
      for (int i = 0; i < 2; ++i) (void)timed_run(*base_);
      step_seconds_ = timed_run(*base_);
      // Layouts first, as they decide which convolutions have Winograd kernels, and those
      // before epilogues, which fuse into whichever kernel is left; each stage weighs its
      // candidates in the plan the earlier stages' choices give.
      weigh_all(layout_candidates(current_.report));
      relower_if_changed();
      weigh_all(algorithm_candidates(current_.report));
      relower_if_changed();
      weigh_all(epilogue_candidates(current_.report));
      base_.reset();
      verify(rules);
    } catch (...) {
      snapshot.restore();
      throw;
    }
    snapshot.restore();
    return {decisions_, report_};
  }

private:
  [[nodiscard]] double elapsed() const {
    return std::chrono::duration<double>(Clock::now() - start_).count();
  }
  /// Executors run on made-up inputs and never stop a tuning for a non-finite loss.
  Executor open_tuning(Lowered l) {
    l.plan.check_finite = false;
    Executor exe = open_(std::move(l));
    feed_made_up_inputs(exe);
    return exe;
  }
  /// Lowers and opens the current decisions where they differ from the open plan's.
  void relower_if_changed() {
    if (decisions_.choices == lowered_choices_) return;
    current_ = lower_(decisions_);
    lowered_choices_ = decisions_.choices;
    open_current();
  }
  void open_current() {
    base_.reset();
    base_ = std::make_unique<Executor>(open_tuning(current_));
    base_->set_profiling(true);
    (void)profiled_run(*base_);
  }

  /// Seconds the final check takes: both steps, `verify_rounds` times each, and opening them.
  [[nodiscard]] double verify_seconds() const { return (2 * verify_rounds + 4) * step_seconds_; }

  void weigh_all(const std::vector<Candidate>& candidates) {
    struct Weighed {
      Candidate candidate;
      Lowered lowered;
      Difference difference;
      double predicted_rule = 0.0, predicted_other = 0.0;
    };
    std::vector<Weighed> weighed;
    for (const Candidate& c : candidates) {
      Decisions flipped = decisions_;
      flipped.choices[c.key] = c.other;
      Lowered l = lower_(flipped);
      Difference d = differing_steps(current_.plan, l.plan);
      if (d.only_a.empty() && d.only_b.empty()) continue; // the flip changes no kernel
      const double rule = predicted_seconds(current_.plan, d.only_a, model_);
      const double other = predicted_seconds(l.plan, d.only_b, model_);
      weighed.push_back({c, std::move(l), std::move(d), rule, other});
    }
    // The decisions that could matter most first, while there is time to measure them.
    std::sort(weighed.begin(), weighed.end(), [](const Weighed& a, const Weighed& b) {
      return std::max(a.predicted_rule, a.predicted_other) >
             std::max(b.predicted_rule, b.predicted_other);
    });
    for (Weighed& w : weighed) {
      TunedDecision record{w.candidate.key,
                           w.candidate.description,
                           w.candidate.rule,
                           w.candidate.rule,
                           {{w.candidate.rule, 1e3 * w.predicted_rule, -1.0},
                            {w.candidate.other, 1e3 * w.predicted_other, -1.0}}};
      const bool model_sure = w.predicted_other > model_doubt * w.predicted_rule;
      const double cost = (2 * rounds + 3) * step_seconds_;
      // Flips that change the same kernels (groups whose layouts are tied) are measured once.
      const std::string change = change_text(current_.plan, w.lowered.plan, w.difference);
      const auto seen = measured_.find(change);
      if (!model_sure &&
          (seen != measured_.end() || elapsed() + cost + verify_seconds() <= settings_.seconds)) {
        const Measured m =
            seen != measured_.end() ? seen->second : measure(std::move(w.lowered), w.difference);
        measured_[change] = m;
        record.candidates[0].measured_ms = 1e3 * m.rule;
        record.candidates[1].measured_ms = 1e3 * m.other;
        if (m.other_over_rule < keep_share) {
          record.chosen = w.candidate.other;
          decisions_.choices[w.candidate.key] = w.candidate.other;
        }
      } else if (!model_sure) {
        ++skipped_;
      }
      report_.decisions.push_back(std::move(record));
    }
  }

  /// The kernels a flip removes and adds, by signature, in a canonical order.
  static std::string change_text(const Plan& from, const Plan& to, const Difference& d) {
    std::vector<std::string> removed, added;
    for (std::size_t i : d.only_a) removed.push_back(kernel_signature(from.steps[i]));
    for (std::size_t i : d.only_b) added.push_back(kernel_signature(to.steps[i]));
    std::sort(removed.begin(), removed.end());
    std::sort(added.begin(), added.end());
    std::string text;
    for (const std::string& s : removed) text += "-" + s + "\n";
    for (const std::string& s : added) text += "+" + s + "\n";
    return text;
  }

  /// Median seconds per run of the differing kernels of the current plan (`rule`) and of the
  /// other choice's, and the median of their ratio run by run.
  struct Measured {
    double rule = 0.0, other = 0.0, other_over_rule = 1.0;
  };

  /// Measured times of the differing kernels of the current plan and of `other`, runs of the
  /// two alternating.
  Measured measure(Lowered other, const Difference& d) {
    Executor alt = open_tuning(std::move(other));
    alt.set_profiling(true);
    (void)profiled_run(alt);
    std::vector<double> rule_times, other_times;
    for (int r = 0; r < rounds; ++r) {
      const std::vector<double> a = profiled_run(*base_);
      const std::vector<double> b = profiled_run(alt);
      double ta = 0.0, tb = 0.0;
      for (std::size_t i : d.only_a) ta += a[i];
      for (std::size_t i : d.only_b) tb += b[i];
      rule_times.push_back(ta);
      other_times.push_back(tb);
    }
    return {median(rule_times), median(other_times), median_ratio(other_times, rule_times)};
  }

  /// Times the whole tuned step against the rules' step, alternately, and keeps the rules
  /// unless the tuned step is faster by more than the noise.
  void verify(const Lowered& rules) {
    Executor rules_exe = open_tuning(rules);
    std::vector<double> rules_times, tuned_times;
    if (decisions_.empty()) {
      (void)timed_run(rules_exe);
      for (int r = 0; r < verify_rounds; ++r) rules_times.push_back(timed_run(rules_exe));
      report_.rules_ms = report_.tuned_ms = 1e3 * median(rules_times);
      report_.note = "every rule held" + skipped_note();
      return;
    }
    Executor tuned_exe = open_tuning(lower_(decisions_));
    (void)timed_run(rules_exe);
    (void)timed_run(tuned_exe);
    for (int r = 0; r < verify_rounds; ++r) {
      rules_times.push_back(timed_run(rules_exe));
      tuned_times.push_back(timed_run(tuned_exe));
    }
    report_.rules_ms = 1e3 * median(rules_times);
    report_.tuned_ms = 1e3 * median(tuned_times);
    if (median_ratio(tuned_times, rules_times) < verify_share) {
      report_.note =
          std::to_string(decisions_.choices.size()) + " decision(s) changed" + skipped_note();
      return;
    }
    report_.note = "kept the rules: the tuned step was not 1% faster as a whole" + skipped_note();
    report_.tuned_ms = report_.rules_ms;
    for (TunedDecision& d : report_.decisions) d.chosen = d.rule;
    decisions_.choices.clear();
  }

  [[nodiscard]] std::string skipped_note() const {
    return skipped_ ? "; " + std::to_string(skipped_) +
                          " uncertain decision(s) left to the rules at the time cap"
                    : "";
  }

  /// Runs of each plan per measured decision, and of each whole step in the final check.
  static constexpr int rounds = 3, verify_rounds = 5;
  /// The model settles a decision for the rule when it predicts the other choice this many
  /// times slower; measured, the other choice is kept when it takes under this share of the
  /// rule's time (the median of the runs' ratios).
  static constexpr double model_doubt = 2.0, keep_share = 0.97;
  /// The tuned step replaces the rules' only when it takes under this share of their time
  /// (the median of the runs' ratios): a smaller gain is within the noise of a few runs on a
  /// shared machine.
  static constexpr double verify_share = 0.99;

  TunerSettings settings_;
  LowerFn lower_;
  OpenFn open_;
  CostModel model_;
  Clock::time_point start_;
  Lowered current_;
  std::unique_ptr<Executor> base_;
  double step_seconds_ = 0.0;
  int skipped_ = 0;
  std::map<std::string, Measured> measured_; ///< by change_text
  Decisions decisions_;
  std::map<std::string, std::string, std::less<>> lowered_choices_;
  TuningReport report_;
};

} // namespace tuning_detail

/// Compiles with tuning: the cached decisions for this machine and graph when the cache has
/// them, else a fresh tuning (see tuning_detail::Tuner), stored in the cache. `lower` optimises
/// and lowers the graph with the given decisions, for the tuner's trials; `finish` compiles the
/// executor to return, with the decisions kept and the tuning's report. A data-parallel step
/// cannot be tuned: its ranks would time different candidates and could disagree.
inline Executor
compile_tuned(const TunerSettings& settings, const std::function<Lowered(const Decisions&)>& lower,
              const std::function<Executor(Lowered)>& open,
              const std::function<Executor(const Decisions&, TuningReport)>& finish) {
  const auto start = tuning_detail::Clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(tuning_detail::Clock::now() - start).count();
  };
  TuningCache cache(settings.cache);
  if (std::optional<TuningEntry> hit = cache.find(settings.key)) {
    TuningReport report = std::move(hit->report);
    report.ran = report.from_cache = true;
    report.cache_file = settings.cache.string();
    report.seconds = seconds();
    return finish(hit->decisions, std::move(report));
  }
  Lowered rules = lower({});
  if (rules.plan.communicator)
    fail(errc::argument,
         "compile: tune = Tune::quick cannot tune a data-parallel step (each rank would time "
         "its own candidates and the ranks could disagree); tune the one-process step, or "
         "leave tune off");
  const int threads = rules.plan.threads;
  MachinePeak peak;
  if (std::optional<MachinePeak> cached = cache.peak(settings.machine_key, threads)) {
    peak = *cached;
  } else {
    peak = machine_peak(rules.plan.target, threads);
    cache.set_peak(settings.machine_key, peak);
  }
  tuning_detail::Tuner tuner(settings, lower, open, start);
  TuningEntry entry = tuner.run(rules, peak);
  entry.report.ran = true;
  entry.report.seconds = seconds();
  entry.report.cache_file = settings.cache.string();
  cache.set(settings.key, entry);
  if (const std::string problem = cache.store(); !problem.empty())
    entry.report.note += "; " + problem;
  return finish(entry.decisions, std::move(entry.report));
}

} // namespace kiln
