// vs_libtorch: kiln against libtorch (PyTorch's C++ API) training the same networks with the
// same batch, thread count and optimizer (SGD, momentum 0.9), the two alternating in one
// run; prints ms per step for each and the ratio. --json writes the same; `vs_libtorch --help`
// lists its flags.
//
// libtorch's OpenBLAS keeps a thread pool of its own that fights its OpenMP pool over the
// cores, so the benchmark runs with OPENBLAS_NUM_THREADS=1 (libtorch's best setting here),
// re-executing itself to set it before the library loads.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "kiln/kiln.hpp"
#include "kiln_tools/json_output.hpp"
#include "torch_reference.hpp"

namespace {

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
  std::printf("training step, batch %d, %d threads, SGD momentum %.1f, OPENBLAS_NUM_THREADS=%s, "
              "median of %d rounds x %d steps\n",
              batch, threads, static_cast<double>(momentum), std::getenv("OPENBLAS_NUM_THREADS"),
              rounds, steps);
  std::printf("%-14s %10s %10s %10s %12s\n", "network", "kiln ms", "torch ms", "ratio",
              "kiln img/s");
  for (const auto& [network, make] : bench::reference_networks) {
    kiln::Graph g;
    bench::build_training_step(g, make, batch, {.lr = lr, .momentum = momentum});
    kiln::Executor exe = kiln::compile(g, {.threads = threads});
    exe.set_input("x", images);
    exe.set_input("y", labels);
    target = exe.plan().target.isa;
    bench::TorchTrainer torch(network, batch, images, labels, lr, momentum);
    exe.run(); // warm-up
    torch.step();
    const bench::Timing t =
        bench::time_alternately({[&] { exe.run(); }, [&] { torch.step(); }}, rounds, steps);
    const double kiln_ms = t.per_executor[0].median, torch_ms = t.per_executor[1].median;
    std::printf("%-14s %10.2f %10.2f %9.2fx %12.0f\n", network, kiln_ms, torch_ms,
                torch_ms / kiln_ms, 1000.0 * batch / kiln_ms);
    rows.push_back({{"network", network},
                    {"kiln_ms_per_step", kiln_ms},
                    {"torch_ms_per_step", torch_ms},
                    {"speedup", torch_ms / kiln_ms},
                    {"threads", threads},
                    {"batch", batch},
                    {"target", target},
                    {"other_cores_busy", t.other_cores}});
    bench::print_neighbours(t);
  }
  std::printf("kiln target %s; %s\n", target.c_str(), bench::torch_version().c_str());
  json.write(rows);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) {
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    execv("/proc/self/exe", argv);
    std::perror("vs_libtorch: cannot re-execute itself with OPENBLAS_NUM_THREADS=1");
    return 1;
  }
  CLI::App app("Times kiln's and libtorch's training steps of the same networks, alternately "
               "in one run.",
               "vs_libtorch");
  bench::StepFlags flags;
  flags.rounds = 7;
  bench::add_step_flags(app, flags);
  return kiln::tools::run(app, argc, argv, [&] { return run(flags); });
}
