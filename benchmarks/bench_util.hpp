// What the training-step benchmarks share: their flags, alternating timed runs, and the
// checks that no other process took a core meanwhile (../shared/BENCHMARKING.md) and that the
// cores stayed as far apart as they started (core_distance.hpp).
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core_distance.hpp"
#include "kiln/kiln.hpp"
#include "kiln_tools/command_line.hpp"

namespace bench {

/// The flags every training-step benchmark takes.
struct StepFlags {
  int threads = 2, batch = 64, rounds = 5, steps = 5;
  std::string json;
};

/// Gives `app` the shared conventions and the flags --batch, --rounds, --steps, --json and,
/// unless the benchmark sets the thread counts itself, --threads, read into `flags` (whose
/// values are the defaults).
inline void add_step_flags(CLI::App& app, StepFlags& flags, bool threads_flag = true) {
  kiln::tools::share_conventions(app);
  if (threads_flag)
    app.add_option("-t,--threads", flags.threads, "worker threads")
        ->check(kiln::tools::integer_in(1, 1024));
  app.add_option("-b,--batch", flags.batch, "images per training step")
      ->check(kiln::tools::integer_in(1, 4096));
  app.add_option("-r,--rounds", flags.rounds, "rounds; each times every configuration once")
      ->check(kiln::tools::integer_in(1, 1000));
  app.add_option("-s,--steps", flags.steps, "timed steps per configuration and round")
      ->check(kiln::tools::integer_in(1, 10000));
  app.add_option("--json", flags.json, "write the results as JSON (docs/json.md)");
}

/// The three reference networks every training-step benchmark runs.
inline const std::pair<const char*, kiln::nn::Sequential (*)()> reference_networks[] = {
    {"mnist_cnn", &kiln::nn::models::mnist_cnn},
    {"lenet5", &kiln::nn::models::lenet5},
    {"small_resnet", &kiln::nn::models::small_resnet}};

/// Adds -m,--model: one of reference_networks, read into `model`.
inline void add_model_flag(CLI::App& app, std::string& model) {
  std::vector<std::string> names;
  for (const auto& [name, make] : reference_networks) names.emplace_back(name);
  app.add_option("-m,--model", model, "the network (kiln::nn::models)")
      ->check(kiln::tools::one_of(names, "model"));
}

/// A fresh copy of the reference network called `name` (add_model_flag checked the name).
inline kiln::nn::Sequential reference_network(const std::string& name) {
  for (const auto& [network, make] : reference_networks)
    if (name == network) return make();
  kiln::fail(kiln::errc::argument, "--model: no reference network '" + name + "'");
}

/// Builds into `g` the training step of network `make` (seeded parameters, inputs "x" and
/// "y" of `batch` images, softmax cross-entropy, SGD).
inline void build_training_step(kiln::Graph& g, kiln::nn::Sequential (*make)(), int batch,
                                const kiln::optim::SGD& sgd) {
  kiln::nn::manual_seed(1);
  kiln::nn::Sequential net = make();
  const auto x = g.input("x", {batch, 1, 28, 28});
  const auto y = g.input("y", {batch}, kiln::i32);
  (void)kiln::train_step(kiln::softmax_cross_entropy(net(x), y), net.parameters(), sgd);
}

/// One fixed, seeded batch of MNIST-shaped images (values in the normalised range) and labels.
inline void random_batch(int batch, std::vector<float>& images, std::vector<std::int32_t>& labels) {
  kiln::Rng rng(1);
  images.resize(static_cast<std::size_t>(batch) * 784);
  labels.resize(static_cast<std::size_t>(batch));
  for (float& v : images) v = rng.uniform(-0.4f, 2.8f);
  for (auto& l : labels) l = static_cast<std::int32_t>(rng.below(10));
}

/// Median, fastest and slowest of repeated measurements.
struct Spread {
  double median = 0, min = 0, max = 0;
  explicit Spread(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    median = v[v.size() / 2];
    min = v.front();
    max = v.back();
  }
};

/// Milliseconds per run of each executor, how many cores other processes kept busy, and the
/// round trip between the outermost cores at the start of each round.
struct Timing {
  std::vector<Spread> per_executor;
  std::vector<std::vector<double>> per_round; ///< per executor, each round's ms, in order
  double other_cores = 0.0;
  double seconds = 0.0;
  std::optional<std::pair<int, int>> cores; ///< the two cores timed; none on one core
  std::vector<double> core_round_trip_ns;   ///< one per round where cores were timed

  /// Whether the cores' distance changed during the run by more than half again: the host
  /// moved them, and rounds on either side of the move are not comparable.
  [[nodiscard]] bool cores_moved() const {
    if (core_round_trip_ns.empty()) return false;
    const auto [lo, hi] = std::minmax_element(core_round_trip_ns.begin(), core_round_trip_ns.end());
    return *hi > 1.5 * *lo;
  }

  /// How many times faster executor `k` ran than executor `base`: the median over rounds of
  /// the two's ratio in the same round. Pairing by round keeps a change of the machine's speed
  /// between rounds (cores moved apart, a neighbour's load) out of the ratio, which the ratio
  /// of two medians, each perhaps taken from different rounds, does not.
  [[nodiscard]] double speedup(std::size_t k, std::size_t base) const {
    std::vector<double> ratios;
    for (std::size_t r = 0; r < per_round[k].size(); ++r)
      ratios.push_back(per_round[base][r] / per_round[k][r]);
    return Spread(std::move(ratios)).median;
  }
};

namespace detail {
/// Busy and total jiffies of the whole machine, from /proc/stat.
inline std::pair<long long, long long> machine_jiffies() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  long long v[8] = {};
  stat >> cpu >> v[0] >> v[1] >> v[2] >> v[3] >> v[4] >> v[5] >> v[6] >> v[7];
  long long total = 0;
  for (long long x : v) total += x;
  return {total - v[3] - v[4], total};
}

/// CPU seconds this process has used (all threads).
inline double own_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}
} // namespace detail

/// Untimed calls that start each block of timed steps last at least this long. A oneTBB
/// worker idle for 20 ms joined its arena's next work 3.8 to 12 ms late on the Zen 5
/// development host (multiples of the 4 ms scheduler tick; a thread pinned to the other core
/// wakes in 40-140 us): one untimed call of a 0.65 ms step left most of the timed steps that
/// followed it on one thread (LeNet-5: 1.10 ms a step against 0.64).
inline constexpr std::chrono::milliseconds warm_up{20};

/// Calls every runner `steps` times per round, the runners alternating within each round
/// (A B A B ...) so that all of them see the same machine load. Each block of steps starts
/// after a pause and untimed calls for at least `warm_up`: thread pools spin for a while after
/// their last task (libgomp's workers, oneTBB's), and a runner timed while the previous one's
/// threads still spin would lose a core to them; its own threads, asleep by then, must be
/// awake before the timing starts. `finishers[k]`, when given, waits for runner k's work.
/// Each round starts by timing the round trip between the outermost cores.
inline Timing time_alternately(const std::vector<std::function<void()>>& runners, int rounds,
                               int steps,
                               const std::vector<std::function<void()>>& finishers = {}) {
  using clock = std::chrono::steady_clock;
  std::vector<std::vector<double>> ms(runners.size());
  const auto [busy0, total0] = detail::machine_jiffies();
  const double own0 = detail::own_cpu_seconds();
  Timing t;
  t.cores = outermost_cpus();
  const auto wall0 = clock::now();
  for (int r = 0; r < rounds; ++r) {
    if (t.cores)
      if (const auto ns = round_trip_ns(t.cores->first, t.cores->second))
        t.core_round_trip_ns.push_back(*ns);
    for (std::size_t k = 0; k < runners.size(); ++k) {
      const auto finish = [&] {
        if (!finishers.empty()) finishers[k]();
      };
      if (runners.size() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const auto warm0 = clock::now();
      do {
        runners[k]();
        finish();
      } while (clock::now() - warm0 < warm_up);
      const auto t0 = clock::now();
      for (int s = 0; s < steps; ++s) runners[k]();
      finish();
      ms[k].push_back(1000.0 * std::chrono::duration<double>(clock::now() - t0).count() / steps);
    }
  }
  t.seconds = std::chrono::duration<double>(clock::now() - wall0).count();
  const auto [busy1, total1] = detail::machine_jiffies();
  const double cores = static_cast<double>(std::thread::hardware_concurrency());
  const double busy_seconds = static_cast<double>(busy1 - busy0) /
                              static_cast<double>(std::max(1LL, total1 - total0)) * cores *
                              t.seconds;
  t.other_cores = std::max(0.0, busy_seconds - (detail::own_cpu_seconds() - own0)) / t.seconds;
  for (const auto& m : ms) t.per_executor.emplace_back(m);
  t.per_round = std::move(ms);
  return t;
}

/// time_alternately over executors' runs. A device may return before its work is done (a
/// GPU), so every block of steps ends by waiting for its device.
inline Timing time_alternately(std::vector<kiln::Executor>& exes, int rounds, int steps) {
  std::vector<std::function<void()>> runners, finishers;
  for (kiln::Executor& e : exes) {
    runners.emplace_back([&e] { e.run(); });
    finishers.emplace_back([&e] { e.device().synchronize(); });
  }
  return time_alternately(runners, rounds, steps, finishers);
}

/// The lines every benchmark ends its table with: other processes' use of the cores, and the
/// round trip between the outermost cores over the rounds.
inline void print_neighbours(const Timing& t) {
  std::printf("other processes used %.2f of %u cores during the %.1f s run%s\n", t.other_cores,
              std::thread::hardware_concurrency(), t.seconds,
              t.other_cores > 0.1 ? ": busy machine, rerun before quoting" : "");
  if (!t.cores || t.core_round_trip_ns.empty()) return;
  const auto [lo, hi] =
      std::minmax_element(t.core_round_trip_ns.begin(), t.core_round_trip_ns.end());
  std::printf("cores %d and %d: a cache line's round trip took %.0f-%.0f ns over the rounds%s\n",
              t.cores->first, t.cores->second, *lo, *hi,
              t.cores_moved() ? ": the host moved the cores apart or together during the run, "
                                "so its rounds are not comparable; rerun before quoting"
                              : "");
}

/// The JSON of the same: the cores timed and each round's round trip in nanoseconds (empty
/// on one core).
inline nlohmann::json core_distance_json(const Timing& t) {
  nlohmann::json j = {{"round_trip_ns", t.core_round_trip_ns}, {"moved", t.cores_moved()}};
  if (t.cores) j["cores"] = {t.cores->first, t.cores->second};
  return j;
}

} // namespace bench
