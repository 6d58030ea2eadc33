// step_bench: milliseconds per training step of the default MNIST CNN (batch 64) on 1 and
// 2 threads, measured alternately in one run; prints a table and writes JSON.
//
//   step_bench [--batch N] [--rounds N] [--steps N] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include "kiln/kiln.hpp"

#ifndef KILN_BUILD_TYPE
#define KILN_BUILD_TYPE "unknown"
#endif

namespace {

/// Busy and total jiffies of the whole machine, to tell whether neighbours took a core.
struct CpuTimes {
  long long busy = 0, total = 0;
  static CpuTimes now() {
    CpuTimes t;
    std::ifstream stat("/proc/stat");
    std::string cpu;
    long long v[8] = {};
    stat >> cpu >> v[0] >> v[1] >> v[2] >> v[3] >> v[4] >> v[5] >> v[6] >> v[7];
    for (long long x : v) t.total += x;
    t.busy = t.total - v[3] - v[4];
    return t;
  }
};

/// CPU seconds this process has used (all threads).
double own_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Setup {
  kiln::nn::Sequential net;
  kiln::Graph graph;
  kiln::Value loss;
  std::vector<float> images;
  std::vector<std::int32_t> labels;
};

std::unique_ptr<Setup> make_step(int batch) {
  using namespace kiln::nn;
  manual_seed(1);
  auto s = std::make_unique<Setup>();
  s->net = models::mnist_cnn();
  auto x = s->graph.input("x", {batch, 1, 28, 28});
  auto y = s->graph.input("y", {batch}, kiln::i32);
  s->loss = kiln::softmax_cross_entropy(s->net(x), y);
  (void)kiln::train_step(s->loss, s->net.parameters(),
                         kiln::optim::SGD{.lr = 0.01f, .momentum = 0.9f});
  kiln::Rng rng(2);
  s->images.resize(static_cast<std::size_t>(batch) * 784);
  s->labels.resize(static_cast<std::size_t>(batch));
  for (float& v : s->images) v = rng.uniform(-0.4f, 2.8f);
  for (auto& l : s->labels) l = static_cast<std::int32_t>(rng.below(10));
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  int batch = 64, rounds = 7, steps = 10;
  std::string json;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--batch")
      batch = std::stoi(argv[i + 1]);
    else if (a == "--rounds")
      rounds = std::stoi(argv[i + 1]);
    else if (a == "--steps")
      steps = std::stoi(argv[i + 1]);
    else if (a == "--json")
      json = argv[i + 1];
    else {
      std::fprintf(stderr,
                   "usage: step_bench [--batch N] [--rounds N] [--steps N] [--json FILE]\n");
      return 2;
    }
  }
  auto setup = make_step(batch);
  const int thread_counts[] = {1, 2};
  std::vector<kiln::Executor> exes;
  for (int t : thread_counts) {
    exes.push_back(kiln::compile(setup->graph, {.threads = t}));
    exes.back().set_input("x", setup->images);
    exes.back().set_input("y", setup->labels);
    exes.back().run(); // warm-up
  }
  // Alternate 1 and 2 threads (A B A B ...) so both see the same machine load.
  std::vector<double> ms[2];
  const CpuTimes before = CpuTimes::now();
  const double own0 = own_cpu_seconds();
  const auto wall0 = std::chrono::steady_clock::now();
  for (int r = 0; r < rounds; ++r)
    for (std::size_t k = 0; k < exes.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) exes[k].run();
      ms[k].push_back(1000.0 *
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                      steps);
    }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  const CpuTimes after = CpuTimes::now();
  const double cores = static_cast<double>(std::thread::hardware_concurrency());
  const double busy_seconds = static_cast<double>(after.busy - before.busy) /
                              static_cast<double>(std::max(1LL, after.total - before.total)) *
                              cores * wall;
  const double others = std::max(0.0, busy_seconds - (own_cpu_seconds() - own0)) / wall;

  const double gflop = 4.58 * batch / 64.0; // 2·MACs forward + backward of this net, per step
  std::printf("default MNIST CNN training step, batch %d, target %s, %d rounds x %d steps\n", batch,
              exes[0].plan().target.c_str(), rounds, steps);
  std::printf("%-8s %12s %22s %12s %10s\n", "threads", "ms/step", "min..max", "images/s",
              "GFLOP/s");
  for (std::size_t k = 0; k < exes.size(); ++k) {
    const double m = median(ms[k]);
    std::printf("%-8d %12.2f %10.2f..%-10.2f %12.0f %10.1f\n", thread_counts[k], m,
                *std::min_element(ms[k].begin(), ms[k].end()),
                *std::max_element(ms[k].begin(), ms[k].end()), 1000.0 * batch / m,
                gflop / (m / 1000.0));
  }
  std::printf("other processes used %.2f of %.0f cores during the %.1f s run%s\n", others, cores,
              wall, others > 0.1 ? ": busy machine, rerun before quoting" : "");
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"benchmark\": \"step_bench\", \"network\": \"mnist_cnn\", \"batch\": " << batch
        << ", \"target\": \"" << exes[0].plan().target << "\", \"build_type\": \""
        << KILN_BUILD_TYPE << "\", \"results\": [";
    for (std::size_t k = 0; k < exes.size(); ++k)
      out << (k ? ", " : "") << "{\"threads\": " << thread_counts[k]
          << ", \"ms_per_step\": " << median(ms[k])
          << ", \"min\": " << *std::min_element(ms[k].begin(), ms[k].end())
          << ", \"max\": " << *std::max_element(ms[k].begin(), ms[k].end()) << "}";
    out << "], \"other_cores_busy\": " << others << "}\n";
  }
  return 0;
}
