// Data-parallel training on ranks that are threads (dist::thread_group): 2 ranks x batch 32
// follow 1 rank x batch 64 on the same global batches, parameters stay bit-identical across
// ranks, the all-reduces start before the backward pass ends, and a rank that never arrives
// is an error on the others, not a hang.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kiln/dist/data_parallel.hpp"
#include "kiln/dist/thread_group.hpp"
#include "kiln/kiln.hpp"

namespace {

struct ReferenceNetwork {
  const char* name;
  kiln::nn::Sequential (*make)();
};

/// One rank's model and compiled step, its images a share of each global batch.
struct Rank {
  kiln::nn::Sequential net;
  kiln::Graph g;
  kiln::TrainStep step;
  std::unique_ptr<kiln::Executor> exe;
  std::int64_t batch;

  Rank(const ReferenceNetwork& network, std::int64_t batch_size,
       std::shared_ptr<kiln::Communicator> world, std::size_t bucket_bytes = 1 << 20)
      : net(make(network)), step(build(g, net, batch_size, std::move(world), bucket_bytes)),
        exe(std::make_unique<kiln::Executor>(kiln::compile(g, {.threads = 1}))), batch(batch_size) {
  }

  static kiln::nn::Sequential make(const ReferenceNetwork& network) {
    kiln::nn::manual_seed(9); // every rank starts from the same weights
    return network.make();
  }
  static kiln::TrainStep build(kiln::Graph& g, kiln::nn::Sequential& net, std::int64_t batch,
                               std::shared_ptr<kiln::Communicator> world,
                               std::size_t bucket_bytes) {
    const auto x = g.input("x", {batch, 1, 28, 28});
    const auto y = g.input("y", {batch}, kiln::i32);
    return kiln::train_step(kiln::softmax_cross_entropy(net(x), y), net.parameters(),
                            kiln::optim::SGD{.lr = 0.05f, .momentum = 0.9f},
                            {.communicator = std::move(world), .bucket_bytes = bucket_bytes});
  }
  [[nodiscard]] std::vector<kiln::nn::Parameter> state() const {
    return kiln::training_state(net, step);
  }
  /// Runs on images [first, first + batch) of the global batch; returns the loss.
  float run(const std::vector<float>& images, const std::vector<std::int32_t>& labels,
            std::int64_t first) {
    const std::int64_t pixels = 28 * 28;
    exe->set_input("x", std::span<const float>(images.data() + first * pixels,
                                               static_cast<std::size_t>(batch * pixels)));
    exe->set_input(
        "y", std::span<const std::int32_t>(labels.data() + first, static_cast<std::size_t>(batch)));
    exe->run();
    return exe->scalar(step.loss);
  }
};

struct Batches {
  std::vector<std::vector<float>> images;
  std::vector<std::vector<std::int32_t>> labels;
};

Batches random_batches(int count, std::int64_t batch) {
  kiln::Rng rng(21);
  Batches b;
  for (int s = 0; s < count; ++s) {
    std::vector<float> x(static_cast<std::size_t>(batch * 28 * 28));
    for (float& v : x) v = rng.uniform(-1.0f, 1.0f);
    std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
    for (auto& l : y) l = static_cast<std::int32_t>(rng.below(10));
    b.images.push_back(std::move(x));
    b.labels.push_back(std::move(y));
  }
  return b;
}

} // namespace

TEST_CASE("data parallel: 2 ranks x batch 32 follow 1 rank x batch 64, parameters identical "
          "across ranks") {
  const ReferenceNetwork networks[] = {{"mnist_cnn", &kiln::nn::models::mnist_cnn},
                                       {"lenet5", &kiln::nn::models::lenet5}};
  const int steps = 10;
  const Batches data = random_batches(steps, 64);
  for (const ReferenceNetwork& network : networks) {
    INFO(network.name);
    Rank single(network, 64, nullptr);
    std::vector<float> expected;
    for (int s = 0; s < steps; ++s)
      expected.push_back(single.run(data.images[s], data.labels[s], 0));

    const auto world = kiln::dist::thread_group(2);
    // Small buckets, so that the step has several all-reduces in flight.
    std::vector<std::unique_ptr<Rank>> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.push_back(std::make_unique<Rank>(network, 32, world[r], 64 << 10));
    CHECK(ranks[0]->step.collectives > 1);
    std::vector<std::vector<float>> losses(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        for (int s = 0; s < steps; ++s)
          losses[static_cast<std::size_t>(r)].push_back(
              ranks[static_cast<std::size_t>(r)]->run(data.images[s], data.labels[s], 32 * r));
      });
    for (std::thread& t : threads) t.join();
    for (int s = 0; s < steps; ++s) {
      INFO("step " << s);
      const float mean =
          (losses[0][static_cast<std::size_t>(s)] + losses[1][static_cast<std::size_t>(s)]) / 2.0f;
      CHECK(std::abs(mean - expected[static_cast<std::size_t>(s)]) <=
            1e-4f * std::abs(expected[static_cast<std::size_t>(s)]));
    }
    const auto state0 = ranks[0]->state(), state1 = ranks[1]->state();
    CHECK(kiln::dist::parameter_checksum(state0) == kiln::dist::parameter_checksum(state1));
    for (std::size_t i = 0; i < state0.size(); ++i) {
      INFO(state0[i].name);
      CHECK(std::ranges::equal(state0[i].tensor->f32(), state1[i].tensor->f32()));
    }
  }
}

TEST_CASE("data parallel: the all-reduces start during the backward pass and are waited on after "
          "it") {
  const auto world = kiln::dist::thread_group(2);
  Rank rank({"mnist_cnn", &kiln::nn::models::mnist_cnn}, 8, world[0], 64 << 10);
  const kiln::Plan& plan = rank.exe->plan();
  std::vector<std::size_t> starts, waits;
  std::size_t last_gradient = 0;
  for (std::size_t i = 0; i < plan.steps.size(); ++i) {
    const kiln::Op op = plan.steps[i].op;
    if (op == kiln::Op::AllreduceStart) starts.push_back(i);
    if (op == kiln::Op::AllreduceWait) waits.push_back(i);
    if (op == kiln::Op::Conv2dGradWeight || op == kiln::Op::Conv2dGradInput) last_gradient = i;
  }
  REQUIRE(starts.size() == static_cast<std::size_t>(rank.step.collectives));
  REQUIRE(waits.size() == starts.size());
  CHECK(starts.front() < last_gradient); // the first bucket overlaps the rest of the backward
  CHECK(*std::max_element(starts.begin(), starts.end()) < waits.front());
  CHECK(waits.front() > last_gradient);
}

TEST_CASE("data parallel: a rank that never arrives is kiln.dist.collective on the others") {
  const auto world = kiln::dist::thread_group(2, 0.3);
  Rank alone({"lenet5", &kiln::nn::models::lenet5}, 8, world[0]);
  const Batches data = random_batches(1, 8);
  try {
    (void)alone.run(data.images[0], data.labels[0], 0);
    FAIL("a step finished without its other rank");
  } catch (const kiln::Error& e) {
    CHECK(e.code() == "kiln.dist.collective");
    CHECK(e.message().find("rank 0") != std::string::npos);
    CHECK(e.message().find("gradient bucket") != std::string::npos);
  }
  try { // and the blocking calls refuse at once afterwards
    std::vector<double> one{1.0};
    world[0]->sum(one);
    FAIL("a sum ran after a failure");
  } catch (const kiln::Error& e) {
    CHECK(e.code() == "kiln.dist.collective");
  }
}

TEST_CASE("data parallel: broadcast gives every rank rank 0's parameters, and differing ones are "
          "kiln.dist.mismatch") {
  const auto world = kiln::dist::thread_group(2);
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(
        std::make_unique<Rank>(ReferenceNetwork{"lenet5", &kiln::nn::models::lenet5}, 8, world[r]));
  ranks[1]->state()[0].tensor->f32()[3] += 1.0f;
  std::vector<std::string> errors(2);
  const auto on_each_rank = [&](auto body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        try {
          body(r);
        } catch (const kiln::Error& e) {
          errors[static_cast<std::size_t>(r)] = e.code();
        }
      });
    for (std::thread& t : threads) t.join();
  };
  on_each_rank([&](int r) {
    kiln::dist::check_same_parameters(*world[static_cast<std::size_t>(r)],
                                      ranks[static_cast<std::size_t>(r)]->state(), "at the start");
  });
  CHECK(errors[0] == "kiln.dist.mismatch");
  CHECK(errors[1] == "kiln.dist.mismatch");
  errors = {"", ""};
  on_each_rank([&](int r) {
    const auto state = ranks[static_cast<std::size_t>(r)]->state();
    kiln::dist::broadcast_parameters(*world[static_cast<std::size_t>(r)], state);
    kiln::dist::check_same_parameters(*world[static_cast<std::size_t>(r)], state,
                                      "after broadcast");
  });
  CHECK(errors[0].empty());
  CHECK(errors[1].empty());
}

TEST_CASE("data parallel: the loader's shares of a global batch are the one-rank batch, in order") {
  kiln::data::Dataset d;
  d.count = 100;
  d.height = d.width = 2;
  d.images.resize(400);
  d.labels.resize(100);
  for (int i = 0; i < 100; ++i) {
    d.labels[static_cast<std::size_t>(i)] = i;
    for (int p = 0; p < 4; ++p)
      d.images[static_cast<std::size_t>(i * 4 + p)] = static_cast<float>(i);
  }
  kiln::data::BatchLoader whole(d, {.batch_size = 20, .seed = 4});
  std::vector<kiln::data::BatchLoader> shares;
  for (int r = 0; r < 2; ++r)
    shares.emplace_back(
        d, kiln::data::LoaderOptions{.batch_size = 10, .seed = 4, .rank = r, .ranks = 2});
  CHECK(whole.batches() == 5);
  CHECK(shares[0].batches() == 5);
  for (int epoch = 0; epoch < 2; ++epoch) {
    whole.start_epoch(epoch);
    for (auto& s : shares) s.start_epoch(epoch);
    for (std::int64_t b = 0; b < whole.batches(); ++b) {
      std::vector<float> x(80), part(40);
      std::vector<std::int32_t> y(20), labels(10);
      whole.fill(b, x, y);
      std::vector<std::int32_t> joined;
      for (auto& s : shares) {
        s.fill(b, part, labels);
        joined.insert(joined.end(), labels.begin(), labels.end());
      }
      CHECK(joined == y);
    }
  }
  CHECK_THROWS_WITH_AS(kiln::data::BatchLoader(d, {.rank = 2, .ranks = 2}),
                       doctest::Contains("rank 2 of 2 ranks"), kiln::Error);
  CHECK_THROWS_AS(kiln::dist::thread_group(0), kiln::Error);
}

TEST_CASE("data parallel: a collective's time counts as waited only while a rank blocks on it") {
  using namespace std::chrono_literals;
  const auto world = kiln::dist::thread_group(2);
  for (auto& rank : world) rank->reserve(1);
  std::vector<float> a(16, 1.0f), b(16, 2.0f);
  // Rank 0 starts and waits at once; rank 1 joins 100 ms later and only then asks: rank 0
  // waits about 100 ms, rank 1 not at all.
  std::thread late([&] {
    std::this_thread::sleep_for(100ms);
    world[1]->start_sum(0, b.data(), 16);
    std::this_thread::sleep_for(50ms);
    CHECK(world[1]->wait(0));
  });
  world[0]->start_sum(0, a.data(), 16);
  CHECK(world[0]->wait(0));
  late.join();
  CHECK(a[5] == 3.0f);
  CHECK(b[5] == 3.0f);
  const kiln::CollectiveTimes first = world[0]->take_times(), second = world[1]->take_times();
  CHECK(first.collectives == 1);
  CHECK(first.waited_seconds >= 0.08);
  CHECK(first.in_flight_seconds >= first.waited_seconds);
  CHECK(first.hidden_share() < 0.2);
  CHECK(second.collectives == 1);
  CHECK(second.waited_seconds == 0.0);
  CHECK(second.window_seconds >= 0.04);
  CHECK(second.in_flight_seconds < 0.04); // complete when it started: rank 0 was there first
  CHECK(world[0]->take_times().collectives == 0); // taking them starts afresh
}
