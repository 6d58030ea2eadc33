// What the training-step benchmarks share: their flags, alternating timed runs, and the
// check that no other process took a core meanwhile (../shared/BENCHMARKING.md).
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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

/// Milliseconds per run of each executor, and how many cores other processes kept busy.
struct Timing {
  std::vector<Spread> per_executor;
  double other_cores = 0.0;
  double seconds = 0.0;
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

/// Calls every runner `steps` times per round, the runners alternating within each round
/// (A B A B ...) so that all of them see the same machine load. Each block of steps starts
/// after a pause and one untimed call: thread pools spin for a while after their last task
/// (libgomp's workers, oneTBB's), and a runner timed while the previous one's threads still
/// spin would lose a core to them. `finishers[k]`, when given, waits for runner k's work.
inline Timing time_alternately(const std::vector<std::function<void()>>& runners, int rounds,
                               int steps,
                               const std::vector<std::function<void()>>& finishers = {}) {
  using clock = std::chrono::steady_clock;
  std::vector<std::vector<double>> ms(runners.size());
  const auto [busy0, total0] = detail::machine_jiffies();
  const double own0 = detail::own_cpu_seconds();
  const auto wall0 = clock::now();
  for (int r = 0; r < rounds; ++r)
    for (std::size_t k = 0; k < runners.size(); ++k) {
      const auto finish = [&] {
        if (!finishers.empty()) finishers[k]();
      };
      if (runners.size() > 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        runners[k]();
        finish();
      }
      const auto t0 = clock::now();
      for (int s = 0; s < steps; ++s) runners[k]();
      finish();
      ms[k].push_back(1000.0 * std::chrono::duration<double>(clock::now() - t0).count() / steps);
    }
  Timing t;
  t.seconds = std::chrono::duration<double>(clock::now() - wall0).count();
  const auto [busy1, total1] = detail::machine_jiffies();
  const double cores = static_cast<double>(std::thread::hardware_concurrency());
  const double busy_seconds = static_cast<double>(busy1 - busy0) /
                              static_cast<double>(std::max(1LL, total1 - total0)) * cores *
                              t.seconds;
  t.other_cores = std::max(0.0, busy_seconds - (detail::own_cpu_seconds() - own0)) / t.seconds;
  for (auto& m : ms) t.per_executor.emplace_back(std::move(m));
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

/// The line every benchmark ends its table with.
inline void print_neighbours(const Timing& t) {
  std::printf("other processes used %.2f of %u cores during the %.1f s run%s\n", t.other_cores,
              std::thread::hardware_concurrency(), t.seconds,
              t.other_cores > 0.1 ? ": busy machine, rerun before quoting" : "");
}

} // namespace bench
