// data_parallel_bench: under `mpirun -np 2`, each reference network's training step on 2 ranks
// x 1 thread against 1 rank x 2 threads at the same global batch, alternately in one run; the
// all-reduce of its gradients alone; MPI's latency and bandwidth here; and what a ring
// all-reduce over a stated network would cost on N machines (README, "Scaling").
// `data_parallel_bench --help` lists its flags.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "kiln/dist/mpi.hpp"
#include "kiln/kiln.hpp"
#include "kiln_tools/json_output.hpp"

#ifndef KILN_BUILD_TYPE
#define KILN_BUILD_TYPE "unknown"
#endif

namespace {

using Clock = std::chrono::steady_clock;

/// The step benchmarks' flags (each rank runs one thread; --batch is the global batch) and
/// the modelled network.
struct Flags : bench::StepFlags {
  double link_gbit = 10.0, link_latency_us = 25.0;
};

/// One network's step, compiled both ways, and its gradient buckets.
struct Network {
  std::string name;
  kiln::nn::Sequential distributed_net, single_net;
  kiln::Graph distributed_graph, single_graph;
  std::unique_ptr<kiln::Executor> distributed, single; ///< single: rank 0 only
  std::vector<std::int64_t> bucket_floats;
  std::vector<double> distributed_ms, single_ms, allreduce_ms;
  kiln::CollectiveTimes times; ///< of the timed distributed steps, summed over the rounds
};

double since_ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Every rank waits here for the others (a blocking gather, which polls and sleeps).
void barrier(kiln::Communicator& world) { (void)world.gather(0); }

std::unique_ptr<kiln::Executor> compile_step(kiln::Graph& g, kiln::nn::Sequential& net,
                                             kiln::nn::Sequential (*make)(), int batch,
                                             const std::shared_ptr<kiln::Communicator>& world,
                                             int threads) {
  kiln::nn::manual_seed(1); // the same initial parameters on every rank and for both steps
  net = make();
  const auto x = g.input("x", {batch, 1, 28, 28});
  const auto y = g.input("y", {batch}, kiln::i32);
  (void)kiln::train_step(kiln::softmax_cross_entropy(net(x), y), net.parameters(),
                         kiln::optim::SGD{.lr = 0.01f, .momentum = 0.9f}, {.communicator = world});
  auto exe = std::make_unique<kiln::Executor>(kiln::compile(g, {.threads = threads}));
  std::vector<float> images;
  std::vector<std::int32_t> labels;
  bench::random_batch(batch, images, labels);
  exe->set_input("x", images);
  exe->set_input("y", labels);
  exe->run(); // warm-up
  return exe;
}

/// Milliseconds per run of `steps` runs of `exe`, after a pause and one untimed run (thread
/// pools still spinning from the previous configuration would take a core).
double time_steps(kiln::Executor& exe, int steps) {
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  exe.run();
  const auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) exe.run();
  return since_ms(t0) / steps;
}

/// One sum over the ranks of `floats` floats, as the steps start and wait for theirs.
double time_sum(kiln::Communicator& world, std::vector<float>& buffer, int repeats) {
  const auto t0 = Clock::now();
  for (int k = 0; k < repeats; ++k) {
    world.start_sum(0, buffer.data(), static_cast<std::int64_t>(buffer.size()));
    if (!world.wait(0)) kiln::fail(kiln::errc::dist_collective, world.failure());
  }
  return since_ms(t0) / repeats;
}

/// A ring all-reduce of `buckets` on `n` machines: 2(n-1) latency-bound rounds per bucket and
/// 2(n-1)/n of its bytes through each machine's link.
double ring_ms(const std::vector<std::int64_t>& buckets, int n, double latency_s,
               double bytes_per_s) {
  double seconds = 0.0;
  for (const std::int64_t floats : buckets)
    seconds += 2.0 * (n - 1) * latency_s +
               2.0 * (n - 1) / n * static_cast<double>(floats) * 4.0 / bytes_per_s;
  return 1000.0 * seconds;
}

int run(const Flags& flags) {
  const kiln::tools::JsonOutput json(flags.json);
  if (flags.batch % 2 != 0)
    kiln::fail(kiln::errc::argument,
               "--batch: " + std::to_string(flags.batch) + " does not split over 2 ranks");
  const std::shared_ptr<kiln::dist::Mpi> world = kiln::dist::Mpi::start();
  const bool lead = world->rank() == 0;
  if (world->size() != 2)
    kiln::fail(kiln::errc::argument, "data_parallel_bench: run it on 2 ranks (mpirun -np 2), not " +
                                         std::to_string(world->size()));
  world->reserve(1);

  // MPI's own cost here: a 4-byte sum is its latency, a 16 MiB one its bandwidth.
  std::vector<float> small(1), large(std::size_t{1} << 22);
  barrier(*world);
  (void)time_sum(*world, large, 2);
  std::vector<double> latency_ms, large_ms;
  for (int r = 0; r < flags.rounds; ++r) {
    barrier(*world);
    latency_ms.push_back(time_sum(*world, small, 200));
    large_ms.push_back(time_sum(*world, large, 5));
  }
  const double here_latency_ms = median(latency_ms);
  const double here_gb_per_s = static_cast<double>(large.size()) * 4.0 /
                               ((median(large_ms) - here_latency_ms) * 1e-3) * 1e-9;

  std::vector<std::unique_ptr<Network>> networks;
  for (const auto& [name, make] : bench::reference_networks) {
    auto n = std::make_unique<Network>();
    n->name = name;
    n->distributed =
        compile_step(n->distributed_graph, n->distributed_net, make, flags.batch / 2, world, 1);
    if (lead)
      n->single = compile_step(n->single_graph, n->single_net, make, flags.batch, nullptr, 2);
    for (const kiln::Node& node : n->distributed_graph.nodes())
      if (node.op == kiln::Op::AllreduceStart) n->bucket_floats.push_back(node.type.shape.numel());
    networks.push_back(std::move(n));
  }
  std::int64_t most_floats = 0;
  for (const auto& n : networks)
    for (std::int64_t f : n->bucket_floats) most_floats = std::max(most_floats, f);
  std::vector<float> buckets_buffer(static_cast<std::size_t>(most_floats));

  for (int r = 0; r < flags.rounds; ++r)
    for (auto& n : networks) {
      barrier(*world);
      (void)world->take_times();
      n->distributed_ms.push_back(time_steps(*n->distributed, flags.steps));
      const kiln::CollectiveTimes t = world->take_times(); // includes the untimed run's
      n->times.collectives += t.collectives;
      n->times.in_flight_seconds += t.in_flight_seconds;
      n->times.waited_seconds += t.waited_seconds;
      n->times.window_seconds += t.window_seconds;
      barrier(*world);
      if (lead) n->single_ms.push_back(time_steps(*n->single, flags.steps));
      barrier(*world);
      // The network's buckets summed one after another, with nothing to overlap.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const auto t0 = Clock::now();
      for (int s = 0; s < flags.steps; ++s)
        for (const std::int64_t floats : n->bucket_floats) {
          world->start_sum(0, buckets_buffer.data(), floats);
          if (!world->wait(0)) kiln::fail(kiln::errc::dist_collective, world->failure());
        }
      n->allreduce_ms.push_back(since_ms(t0) / flags.steps);
    }
  (void)world->take_times();
  if (!lead) return 0;

  const double link_bytes_per_s = flags.link_gbit * 1e9 / 8.0;
  const double link_latency_s = flags.link_latency_us * 1e-6;
  const std::string target = networks[0]->distributed->plan().target.isa;
  std::printf("data_parallel_bench: global batch %d, target %s, %d rounds x %d steps, "
              "alternating\n",
              flags.batch, target.c_str(), flags.rounds, flags.steps);
  std::printf("MPI here (2 ranks, one machine): latency %.1f us, bandwidth %.2f GB/s "
              "(4 bytes and 16 MiB summed)\n\n",
              1000.0 * here_latency_ms, here_gb_per_s);
  std::printf("%-13s %9s %7s | %11s %11s %8s | %12s %10s %10s %7s\n", "network", "gradient",
              "buckets", "2x1 ms/step", "1x2 ms/step", "2x1/1x2", "all-reduce", "waited", "window",
              "hidden");
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& n : networks) {
    std::int64_t floats = 0;
    for (std::int64_t f : n->bucket_floats) floats += f;
    const double steps_timed = static_cast<double>(flags.rounds) * (flags.steps + 1);
    const double distributed = median(n->distributed_ms), single = median(n->single_ms);
    const double allreduce = median(n->allreduce_ms);
    const double waited = 1000.0 * n->times.waited_seconds / steps_timed;
    const double window = 1000.0 * n->times.window_seconds / steps_timed;
    std::printf("%-13s %6.2f MB %7zu | %11.2f %11.2f %8.2f | %9.3f ms %7.3f ms %7.2f ms %6.0f%%\n",
                n->name.c_str(), static_cast<double>(floats) * 4e-6, n->bucket_floats.size(),
                distributed, single, distributed / single, allreduce, waited, window,
                100.0 * n->times.hidden_share());
    // Predicted: each of N machines runs this rank's step; the all-reduce hides behind the
    // compute between its start and its wait (the window), and what is left shows.
    const double compute = distributed - waited;
    nlohmann::json predicted = nlohmann::json::array();
    for (const int machines : {2, 4, 8, 16, 32}) {
      const double ring = ring_ms(n->bucket_floats, machines, link_latency_s, link_bytes_per_s);
      const double step = compute + std::max(0.0, ring - window);
      predicted.push_back({{"machines", machines},
                           {"allreduce_ms", ring},
                           {"ms_per_step", step},
                           {"efficiency", compute / step},
                           {"images_per_s", 1000.0 * machines * (flags.batch / 2) / step}});
    }
    rows.push_back({{"network", n->name},
                    {"gradient_floats", floats},
                    {"buckets", n->bucket_floats.size()},
                    {"two_ranks_one_thread_ms_per_step", distributed},
                    {"one_rank_two_threads_ms_per_step", single},
                    {"allreduce_alone_ms", allreduce},
                    {"waited_ms_per_step", waited},
                    {"window_ms_per_step", window},
                    {"hidden_share", n->times.hidden_share()},
                    {"predicted", predicted}});
  }
  std::printf("\n2x1: 2 ranks x %d images x 1 thread; 1x2: 1 rank x %d images x 2 threads. "
              "all-reduce: the buckets alone, nothing to overlap. waited / window: per step, "
              "blocked on / computing between start and wait. hidden: share of the all-reduce "
              "time in flight that overlapped compute.\n\n",
              flags.batch / 2, flags.batch);
  std::printf("Ring all-reduce over %.0f Gbit/s links with %.0f us latency, each machine "
              "running one 2x1 rank's step (%d images):\n",
              flags.link_gbit, flags.link_latency_us, flags.batch / 2);
  std::printf("%-13s %8s %14s %12s %11s %12s\n", "network", "machines", "all-reduce ms", "ms/step",
              "efficiency", "images/s");
  for (std::size_t k = 0; k < networks.size(); ++k)
    for (const auto& p : rows[k]["predicted"])
      std::printf("%-13s %8d %14.3f %12.2f %10.0f%% %12.0f\n", networks[k]->name.c_str(),
                  p["machines"].get<int>(), p["allreduce_ms"].get<double>(),
                  p["ms_per_step"].get<double>(), 100.0 * p["efficiency"].get<double>(),
                  p["images_per_s"].get<double>());
  json.write({{"benchmark", "data_parallel_bench"},
              {"batch", flags.batch},
              {"target", target},
              {"build_type", KILN_BUILD_TYPE},
              {"mpi_latency_us", 1000.0 * here_latency_ms},
              {"mpi_gb_per_s", here_gb_per_s},
              {"link_gbit", flags.link_gbit},
              {"link_latency_us", flags.link_latency_us},
              {"results", rows}});
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app("Times data-parallel training steps on 2 MPI ranks against one rank with both "
               "threads, alternately, and models a ring all-reduce on N machines.",
               "data_parallel_bench");
  Flags flags;
  flags.steps = 10;
  bench::add_step_flags(app, flags, false);
  app.add_option("--link-gbit", flags.link_gbit, "the modelled network's bandwidth, Gbit/s")
      ->check(CLI::Range(0.001, 1e6));
  app.add_option("--link-latency-us", flags.link_latency_us,
                 "the modelled network's latency per message, microseconds")
      ->check(CLI::Range(0.0, 1e6));
  return kiln::tools::run(app, argc, argv, [&] { return run(flags); });
}
