// data_parallel_mpi: data-parallel training over MPI, run by ctest under mpirun -np 2.
//   data_parallel_mpi same-steps     2 ranks x batch 32 give the losses of 1 rank x batch 64
//                                    (relative 1e-4) over 10 steps, for the MNIST CNN and
//                                    LeNet-5, and bit-identical parameters on both ranks
//   data_parallel_mpi hang|exit      rank 1 stops answering (sleeps, or exits) in step 3: the
//                                    others must fail with kiln.dist.collective, not hang
// Exits 0 when every check on this rank passed; prints one line per check.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kiln/dist/data_parallel.hpp"
#include "kiln/dist/mpi.hpp"
#include "kiln/kiln.hpp"

namespace {

struct Trainer {
  kiln::nn::Sequential net;
  kiln::Graph g;
  kiln::TrainStep step;
  kiln::Executor exe;
  std::int64_t batch;

  Trainer(kiln::nn::Sequential (*make)(), std::int64_t batch_size,
          std::shared_ptr<kiln::Communicator> world)
      : net(seeded(make)), step(build(g, net, batch_size, std::move(world))),
        exe(kiln::compile(g, {.threads = 1})), batch(batch_size) {}

  static kiln::nn::Sequential seeded(kiln::nn::Sequential (*make)()) {
    kiln::nn::manual_seed(9);
    return make();
  }
  static kiln::TrainStep build(kiln::Graph& g, kiln::nn::Sequential& net, std::int64_t batch,
                               std::shared_ptr<kiln::Communicator> world) {
    const auto x = g.input("x", {batch, 1, 28, 28});
    const auto y = g.input("y", {batch}, kiln::i32);
    return kiln::train_step(kiln::softmax_cross_entropy(net(x), y), net.parameters(),
                            kiln::optim::SGD{.lr = 0.05f, .momentum = 0.9f},
                            {.communicator = std::move(world), .bucket_bytes = 64 << 10});
  }
  float run(const std::vector<float>& images, const std::vector<std::int32_t>& labels,
            std::int64_t first) {
    exe.set_input("x", std::span<const float>(images.data() + first * 784,
                                              static_cast<std::size_t>(batch * 784)));
    exe.set_input(
        "y", std::span<const std::int32_t>(labels.data() + first, static_cast<std::size_t>(batch)));
    exe.run();
    return exe.scalar(step.loss);
  }
};

/// The global batch of step `s`: the same on every rank.
void global_batch(int s, std::vector<float>& images, std::vector<std::int32_t>& labels) {
  kiln::Rng rng(static_cast<std::uint64_t>(100 + s));
  images.resize(64 * 784);
  labels.resize(64);
  for (float& v : images) v = rng.uniform(-1.0f, 1.0f);
  for (auto& l : labels) l = static_cast<std::int32_t>(rng.below(10));
}

int same_steps(const std::shared_ptr<kiln::dist::Mpi>& world) {
  int failures = 0;
  const struct {
    const char* name;
    kiln::nn::Sequential (*make)();
  } networks[] = {{"mnist_cnn", &kiln::nn::models::mnist_cnn},
                  {"lenet5", &kiln::nn::models::lenet5}};
  for (const auto& network : networks) {
    Trainer alone(network.make, 64, nullptr);
    Trainer ranked(network.make, 32, world);
    const auto state = kiln::training_state(ranked.net, ranked.step);
    kiln::dist::broadcast_parameters(*world, state);
    double worst = 0.0;
    std::vector<float> images;
    std::vector<std::int32_t> labels;
    for (int s = 0; s < 10; ++s) {
      global_batch(s, images, labels);
      const float expected = alone.run(images, labels, 0);
      std::vector<double> mean{ranked.run(images, labels, 32 * world->rank()) / 2.0};
      world->sum(mean);
      worst = std::max(worst, std::abs(mean[0] - expected) / std::abs(expected));
    }
    const bool close = worst <= 1e-4;
    std::printf("%s: rank %d: %s: 2 ranks x 32 against 1 x 64 over 10 steps: worst relative "
                "loss difference %.2e (%d all-reduces a step)\n",
                close ? "ok" : "FAIL", world->rank(), network.name, worst, ranked.step.collectives);
    failures += !close;
    try {
      kiln::dist::check_same_parameters(*world, state, "after 10 steps");
      std::printf("ok: rank %d: %s: parameters bit-identical on every rank\n", world->rank(),
                  network.name);
    } catch (const kiln::Error& e) {
      std::printf("FAIL: %s\n", e.what());
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

int stop_answering(const std::shared_ptr<kiln::dist::Mpi>& world, bool exit_instead) {
  Trainer ranked(&kiln::nn::models::lenet5, 32, world);
  std::vector<float> images;
  std::vector<std::int32_t> labels;
  for (int s = 0; s < 6; ++s) {
    if (s == 3 && world->rank() == 1) {
      std::fflush(stdout);
      if (exit_instead) ::_exit(3);
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 1;
    }
    global_batch(s, images, labels);
    try {
      (void)ranked.run(images, labels, 32 * world->rank());
    } catch (const kiln::Error& e) {
      const bool named = std::string(e.code()) == "kiln.dist.collective" &&
                         std::string(e.message()).find("rank 0") != std::string::npos;
      std::printf("%s: rank %d: step %d: %s\n", named ? "ok" : "FAIL", world->rank(), s, e.what());
      std::fflush(stdout);
      return named && s == 3 ? 0 : 1;
    }
  }
  std::printf("FAIL: rank %d: every step finished without rank 1\n", world->rank());
  return 1;
}

} // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 2 ? argv[1] : "";
  if (mode != "same-steps" && mode != "hang" && mode != "exit") {
    std::fprintf(stderr, "usage: data_parallel_mpi same-steps|hang|exit\n");
    return 2;
  }
  try {
    const auto world =
        kiln::dist::Mpi::start(argc, argv, {.timeout_seconds = mode == "same-steps" ? 120.0 : 3.0});
    if (world->size() != 2) {
      std::fprintf(stderr, "data_parallel_mpi: run with mpirun -np 2\n");
      return 2;
    }
    return mode == "same-steps" ? same_steps(world) : stop_answering(world, mode == "exit");
  } catch (const kiln::Error& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
