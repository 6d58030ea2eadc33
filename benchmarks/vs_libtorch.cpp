// vs_libtorch: kiln against libtorch (PyTorch's C++ API) training the same networks with the
// same batch, thread count and optimizer (SGD, momentum 0.9), the two alternating in one
// run; prints ms per step for each and the ratio, and where the CPU has AVX512-BF16 also kiln's
// step multiplying in bfloat16 (Precision::bf16) against the same libtorch step. --json writes
// the same; `vs_libtorch --help` lists its flags.
// libtorch runs at its best (bench::run_libtorch_at_its_best).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "kiln/kiln.hpp"
#include "kiln_tools/json_output.hpp"
#include "torch_reference.hpp"

namespace {

/// libtorch's milliseconds per step over about `ms` of steps run back to back.
double long_run_ms(bench::TorchTrainer& torch, double ms) {
  const auto t0 = std::chrono::steady_clock::now();
  int steps = 0;
  double elapsed = 0.0;
  while (elapsed < ms) {
    torch.step();
    ++steps;
    elapsed = 1000.0 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return elapsed / steps;
}

int run(const bench::StepFlags& flags) {
  const kiln::tools::JsonOutput json(flags.json);
  const auto [threads, batch, rounds, steps, json_path] = flags;
  bench::set_torch_threads(threads);
  const float lr = 0.01f, momentum = 0.9f;
  std::vector<float> images;
  std::vector<std::int32_t> labels;
  bench::random_batch(batch, images, labels);
  std::string target;
  nlohmann::json rows = nlohmann::json::array();
  std::printf("training step, batch %d, %d threads, SGD momentum %.1f, median of %d rounds x %d "
              "steps; libtorch with %s\n",
              batch, threads, static_cast<double>(momentum), rounds, steps,
              bench::libtorch_settings().c_str());
  const bool bf16 = kiln::cpu_backend().target().bf16_products;
  std::printf("%-14s %10s %10s %10s %12s", "network", "kiln ms", "torch ms", "ratio", "kiln img/s");
  std::printf(bf16 ? " %13s %10s\n" : "\n", "kiln bf16 ms", "bf16 ratio");
  for (const auto& [network, make] : bench::reference_networks) {
    kiln::Graph g;
    bench::build_training_step(g, make, batch, {.lr = lr, .momentum = momentum});
    kiln::Executor exe = kiln::compile(g, {.threads = threads});
    // The same step with every convolution and matmul that can multiplying in bfloat16.
    kiln::Executor exe_bf16 = kiln::compile(
        g, {.threads = threads, .precision = bf16 ? kiln::Precision::bf16 : kiln::Precision::f32});
    for (kiln::Executor* e : {&exe, &exe_bf16}) {
      e->set_input("x", images);
      e->set_input("y", labels);
      e->run(); // warm-up
    }
    target = exe.plan().target.isa;
    bench::TorchTrainer torch(network, batch, images, labels, lr, momentum);
    torch.step();
    std::vector<std::function<void()>> contenders = {[&] { exe.run(); }, [&] { torch.step(); }};
    if (bf16) contenders.emplace_back([&] { exe_bf16.run(); });
    const bench::Timing t = bench::time_alternately(contenders, rounds, steps);
    const double kiln_ms = t.per_executor[0].median, torch_ms = t.per_executor[1].median;
    const double ratio = t.speedup(0, 1);
    // libtorch's timed blocks are short; its speed over a long run (as a user trains) must
    // agree, or the blocks caught a transient (a cold allocator, a pool that had gone to sleep).
    const double long_ms = long_run_ms(torch, 40.0 * steps * torch_ms);
    std::printf("%-14s %10.2f %10.2f %9.2fx %12.0f", network, kiln_ms, torch_ms, ratio,
                1000.0 * batch / kiln_ms);
    if (bf16) {
      const double bf16_ms = t.per_executor[2].median;
      std::printf(" %13.2f %9.2fx", bf16_ms, t.speedup(2, 1));
    }
    std::printf("   (libtorch over %.1f s: %.2f ms/step%s)\n", 40.0 * steps * torch_ms / 1000.0,
                long_ms,
                std::abs(long_ms / torch_ms - 1.0) > 0.1 ? ", not its timed speed: rerun" : "");
    rows.push_back({{"network", network},
                    {"kiln_ms_per_step", kiln_ms},
                    {"torch_ms_per_step", torch_ms},
                    {"torch_long_run_ms_per_step", long_ms},
                    {"speedup", ratio},
                    {"threads", threads},
                    {"batch", batch},
                    {"target", target},
                    {"other_cores_busy", t.other_cores},
                    {"core_distance", bench::core_distance_json(t)}});
    if (bf16) {
      rows.back()["kiln_bf16_ms_per_step"] = t.per_executor[2].median;
      rows.back()["bf16_speedup"] = t.speedup(2, 1);
    }
    bench::print_neighbours(t);
  }
  std::printf("kiln target %s; %s\n", target.c_str(), bench::torch_version().c_str());
  json.write(rows);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  bench::run_libtorch_at_its_best(argv);
  CLI::App app("Times kiln's and libtorch's training steps of the same networks, alternately "
               "in one run.",
               "vs_libtorch");
  bench::StepFlags flags;
  flags.rounds = 7;
  bench::add_step_flags(app, flags);
  return kiln::tools::run(app, argc, argv, [&] { return run(flags); });
}
