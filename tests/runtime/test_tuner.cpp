// Tuner tests: decisions forced through the tuning cache change the passes as named and leave
// the losses as they were; a real tuning measures, caches and leaves the parameters untouched;
// a second compile reads the cache; a file that is not a tuning cache is never overwritten;
// bad options are errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/kiln.hpp"
#include "support/temp_folder.hpp"

namespace fs = std::filesystem;

namespace {

/// A folder of this test's own, removed afterwards.
struct CacheFolder : kiln::test::TempFolder {
  CacheFolder() : TempFolder("kiln-tuner") {}
};

std::string file_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// LeNet-5's training step at a small batch, its parameters seeded the same every time.
struct LenetStep {
  kiln::nn::Sequential net;
  kiln::Graph graph;
  kiln::Value loss;
  std::vector<float> images;
  std::vector<std::int32_t> labels;

  explicit LenetStep(std::int64_t batch = 16) {
    kiln::nn::manual_seed(3);
    net = kiln::nn::models::lenet5();
    auto x = graph.input("x", {batch, 1, 28, 28});
    auto y = graph.input("y", {batch}, kiln::i32);
    loss = kiln::softmax_cross_entropy(net(x), y);
    (void)kiln::train_step(loss, net.parameters(), kiln::optim::SGD{.lr = 0.01f, .momentum = 0.9f});
    kiln::Rng rng(4);
    images.resize(static_cast<std::size_t>(batch) * 784);
    labels.resize(static_cast<std::size_t>(batch));
    for (float& v : images) v = rng.uniform(0.0f, 1.0f);
    for (auto& l : labels) l = static_cast<std::int32_t>(rng.below(10));
  }

  /// Every parameter's and optimizer buffer's bytes, in the order the plan reads them.
  static std::vector<std::vector<float>> state(const kiln::Executor& exe) {
    std::vector<std::vector<float>> out;
    for (const auto& t : exe.plan().params) {
      const auto* p = static_cast<const float*>(t->data());
      out.emplace_back(p, p + t->numel());
    }
    return out;
  }

  /// Losses of `steps` runs on the same batch.
  std::vector<float> losses(kiln::Executor& exe, int steps) {
    exe.set_input("x", images);
    exe.set_input("y", labels);
    std::vector<float> out;
    for (int i = 0; i < steps; ++i) {
      exe.run();
      out.push_back(exe.scalar(loss));
    }
    return out;
  }
};

/// Compiles `step` on 2 threads with tuning, its decisions cached in `cache`.
kiln::Executor compile_with_tuning(LenetStep& step, const fs::path& cache, double seconds = 5.0) {
  return kiln::compile(
      step.graph,
      {.threads = 2, .tune = kiln::Tune::quick, .tune_seconds = seconds, .tune_cache = cache});
}

/// Puts the weights and optimizer state back as `state` has them, so that the next compile
/// starts where the last one did.
void restore(const kiln::Executor& exe, const std::vector<std::vector<float>>& state) {
  for (std::size_t i = 0; i < state.size(); ++i)
    std::copy(state[i].begin(), state[i].end(), static_cast<float*>(exe.plan().params[i]->data()));
}

void check_same_losses(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-4));
}

} // namespace

TEST_CASE("tuner: decisions read from the cache change exactly the named layout and epilogue, "
          "and the losses stay the same") {
  CacheFolder folder;
  const fs::path cache_file = folder.path / "tuning.json";
  LenetStep step;
  kiln::Executor rules = kiln::compile(step.graph, {.threads = 2});
  const auto start = LenetStep::state(rules);

  // The rules make LeNet-5's second convolution's group NHWC and fuse some epilogue.
  const kiln::CompileReport& report = rules.report();
  const kiln::LayoutDecision* nhwc = nullptr;
  for (const kiln::LayoutDecision& d : report.layouts)
    if (d.layout == "NHWC" && d.saved_bytes > 0) nhwc = &d;
  REQUIRE(nhwc != nullptr);
  const kiln::FusionDecision* fused = nullptr;
  for (const kiln::FusionDecision& d : report.fusion)
    if (d.pass == "fuse_epilogue" && d.reason == kiln::FusionReason::fused) fused = &d;
  REQUIRE(fused != nullptr);

  kiln::TuningEntry entry;
  const std::string layout_key = kiln::layout_decision_key(nhwc->values.front());
  entry.decisions.choices[layout_key] = "NCHW";
  entry.report.note = "written by the test";
  kiln::TuningCache cache(cache_file);
  const kiln::Target& target = kiln::cpu_backend().target();
  cache.set(kiln::TuningCache::key(target, 2, step.graph, ""), entry);
  REQUIRE(cache.store().empty());

  const std::vector<float> expected = step.losses(rules, 4);
  restore(rules, start);
  {
    kiln::Executor tuned = compile_with_tuning(step, cache_file);
    const kiln::CompileReport& r = tuned.report();
    CHECK(r.tuning.ran);
    CHECK(r.tuning.from_cache);
    CHECK(r.tuning.note == "written by the test");
    bool found = false;
    for (const kiln::LayoutDecision& d : r.layouts) {
      if (d.values.front() != nhwc->values.front()) continue;
      found = true;
      CHECK(d.layout == "NCHW");
      CHECK(d.reason == kiln::LayoutReason::measured);
    }
    CHECK(found);
    CHECK(r.pass("layout")->stats != report.pass("layout")->stats);
    check_same_losses(step.losses(tuned, 4), expected);
    restore(tuned, start);
  }

  // An epilogue kept apart: one kernel more, and the same losses. The key names the anchor and
  // its consumer as the epilogue pass saw them, with the rules' layouts.
  entry.decisions.choices.clear();
  entry.decisions.choices[kiln::epilogue_decision_key(fused->producer, fused->consumer)] = "apart";
  kiln::TuningCache again(cache_file);
  again.set(kiln::TuningCache::key(target, 2, step.graph, ""), entry);
  REQUIRE(again.store().empty());
  kiln::Executor apart = compile_with_tuning(step, cache_file);
  CHECK(apart.plan().steps.size() == rules.plan().steps.size() + 1);
  int measured_apart = 0;
  for (const kiln::FusionDecision& d : apart.report().fusion)
    if (d.reason == kiln::FusionReason::measured_apart) {
      ++measured_apart;
      CHECK(d.producer == fused->producer);
      CHECK(d.consumer == fused->consumer);
    }
  CHECK(measured_apart == 1);
  check_same_losses(step.losses(apart, 4), expected);
}

TEST_CASE("tuner: every choice the tuner can make trains the reference networks alike") {
  const std::pair<const char*, kiln::nn::Sequential (*)()> networks[] = {
      {"mnist_cnn", &kiln::nn::models::mnist_cnn},
      {"lenet5", &kiln::nn::models::lenet5},
      {"small_resnet", &kiln::nn::models::small_resnet}};
  for (const auto& [name, make] : networks) {
    CAPTURE(name);
    kiln::nn::manual_seed(5);
    kiln::nn::Sequential net = make();
    kiln::Graph g;
    auto x = g.input("x", {8, 1, 28, 28});
    auto y = g.input("y", {8}, kiln::i32);
    auto loss = kiln::softmax_cross_entropy(net(x), y);
    (void)kiln::train_step(loss, net.parameters(), kiln::optim::SGD{.lr = 0.01f, .momentum = 0.9f});
    kiln::Rng rng(6);
    std::vector<float> images(8 * 784);
    std::vector<std::int32_t> labels(8);
    for (float& v : images) v = rng.uniform(0.0f, 1.0f);
    for (auto& l : labels) l = static_cast<std::int32_t>(rng.below(10));
    const auto losses = [&](kiln::Executor& exe) {
      exe.set_input("x", images);
      exe.set_input("y", labels);
      std::vector<float> out;
      for (int i = 0; i < 4; ++i) {
        exe.run();
        out.push_back(exe.scalar(loss));
      }
      return out;
    };
    kiln::Executor rules = kiln::compile(g, {.threads = 2});
    const auto start = LenetStep::state(rules);
    const std::vector<float> expected = losses(rules);
    restore(rules, start);

    // Every layout flipped, then (with the rules' layouts) every convolution algorithm, then
    // every fused epilogue kept apart: whatever subset the tuner keeps lies between these and
    // the rules. LeNet-5 has no convolution that a Winograd kernel takes (5x5 kernels).
    kiln::TuningEntry layouts, algorithms, epilogues;
    for (const auto& c : kiln::tuning_detail::layout_candidates(rules.report()))
      layouts.decisions.choices[c.key] = c.other;
    for (const auto& c : kiln::tuning_detail::algorithm_candidates(rules.report()))
      algorithms.decisions.choices[c.key] = c.other;
    for (const auto& c : kiln::tuning_detail::epilogue_candidates(rules.report()))
      epilogues.decisions.choices[c.key] = c.other;
    CHECK_FALSE(layouts.decisions.empty());
    CHECK(algorithms.decisions.empty() == (std::string(name) == "lenet5"));
    CHECK_FALSE(epilogues.decisions.empty());
    const auto kernel_names = [](const kiln::Executor& exe) {
      std::vector<std::string> names;
      for (const kiln::PlanStep& s : exe.plan().steps) names.push_back(s.kernel_name);
      return names;
    };
    for (const kiln::TuningEntry* entry : {&layouts, &algorithms, &epilogues}) {
      if (entry->decisions.empty()) continue;
      CacheFolder folder;
      kiln::TuningCache cache(folder.path / "tuning.json");
      cache.set(kiln::TuningCache::key(kiln::cpu_backend().target(), 2, g, ""), *entry);
      REQUIRE(cache.store().empty());
      kiln::Executor flipped =
          kiln::compile(g, {.threads = 2, .tune = kiln::Tune::quick, .tune_cache = cache.path()});
      REQUIRE(flipped.report().tuning.from_cache);
      if (entry == &algorithms) {
        CHECK(kernel_names(flipped) != kernel_names(rules));
      } else {
        CHECK(flipped.plan().steps.size() != rules.plan().steps.size());
      }
      check_same_losses(losses(flipped), expected);
      restore(flipped, start);
    }
  }
}

TEST_CASE("tuner: a tuning measures what the model cannot settle, leaves the weights as they "
          "were, and a second compile reads its cache") {
  CacheFolder folder;
  const fs::path cache_file = folder.path / "nested" / "tuning.json";
  LenetStep step;
  kiln::Executor rules = kiln::compile(step.graph, {.threads = 2});
  const auto start = LenetStep::state(rules);

  kiln::Executor tuned = compile_with_tuning(step, cache_file);
  // Tuning trains on made-up batches; the weights and momentum must be back as they were.
  CHECK(LenetStep::state(tuned) == start);
  const kiln::TuningReport& t = tuned.report().tuning;
  CHECK(t.ran);
  CHECK_FALSE(t.from_cache);
  CHECK(t.cache_file == cache_file.string());
  CHECK(t.rules_ms > 0.0);
  CHECK(t.tuned_ms > 0.0);
  CHECK(t.tuned_ms <= t.rules_ms);
  REQUIRE_FALSE(t.decisions.empty());
  int measured = 0;
  for (const kiln::TunedDecision& d : t.decisions) {
    CHECK((d.key.starts_with("layout %") || d.key.starts_with("epilogue %")));
    REQUIRE(d.candidates.size() == 2);
    CHECK(d.candidates[0].choice == d.rule);
    CHECK(d.candidates[0].predicted_ms > 0.0);
    CHECK(d.candidates[1].predicted_ms > 0.0);
    CHECK((d.chosen == d.candidates[0].choice || d.chosen == d.candidates[1].choice));
    if (d.candidates[0].measured_ms >= 0.0) {
      ++measured;
      CHECK(d.candidates[1].measured_ms >= 0.0);
    } else {
      CHECK(d.chosen == d.rule); // only a measurement overturns a rule
    }
  }
  CHECK(measured > 0);
  REQUIRE(fs::exists(cache_file));
  CHECK(file_text(cache_file).find("\"kiln.tuning.v1\"") != std::string::npos);

  // Tuned and untuned train alike.
  const std::vector<float> tuned_losses = step.losses(tuned, 4);
  restore(tuned, start);
  check_same_losses(tuned_losses, step.losses(rules, 4));
  restore(rules, start);

  kiln::Executor again = compile_with_tuning(step, cache_file);
  const kiln::TuningReport& cached = again.report().tuning;
  CHECK(cached.from_cache);
  CHECK(cached.decisions.size() == t.decisions.size());
  for (std::size_t i = 0; i < t.decisions.size(); ++i)
    CHECK(cached.decisions[i].chosen == t.decisions[i].chosen);
  CHECK(again.plan().steps.size() == tuned.plan().steps.size());
  check_same_losses(step.losses(again, 4), tuned_losses);

  // Another thread count is another machine setting: it tunes afresh.
  restore(again, start);
  kiln::Executor one = kiln::compile(
      step.graph, {.threads = 1, .tune = kiln::Tune::quick, .tune_cache = cache_file});
  CHECK_FALSE(one.report().tuning.from_cache);
}

TEST_CASE("tuner: at its time cap the rules decide what was not measured") {
  CacheFolder folder;
  LenetStep step;
  kiln::Executor exe = compile_with_tuning(step, folder.path / "tuning.json", 0.001);
  const kiln::TuningReport& t = exe.report().tuning;
  CHECK(t.ran);
  CHECK(t.note.find("left to the rules at the time cap") != std::string::npos);
  for (const kiln::TunedDecision& d : t.decisions) {
    CHECK(d.candidates[0].measured_ms < 0.0);
    CHECK(d.chosen == d.rule);
  }
}

TEST_CASE("tuner: runs compared one by one keep a change of the machine's speed out of a ratio") {
  using kiln::tuning_detail::median;
  using kiln::tuning_detail::median_ratio;
  // The other choice takes 0.95 of the rule's time in every pair of runs; the machine slowed
  // threefold between the rule's third run and the other choice's.
  const std::vector<double> rule = {1.0, 1.0, 1.0, 3.0, 3.0};
  const std::vector<double> other = {0.95, 0.95, 2.85, 2.85, 2.85};
  CHECK(median(other) / median(rule) == doctest::Approx(2.85));
  CHECK(median_ratio(other, rule) == doctest::Approx(0.95));
  CHECK(median_ratio({2.0, 4.0}, {1.0, 1.0}) == doctest::Approx(3.0));
  CHECK(median_ratio({1.0}, {0.0}) == std::numeric_limits<double>::infinity());
  CHECK(median_ratio({0.0}, {0.0}) == 1.0);
  CHECK(median_ratio({}, {}) == 1.0);
}

TEST_CASE("tuner: a file that is not a tuning cache is neither read nor overwritten") {
  CacheFolder folder;
  const fs::path file = folder.path / "notes.json";
  for (const std::string& text : {std::string("my notes, not JSON"), std::string("{\"a\": 1}")}) {
    std::ofstream(file) << text;
    LenetStep step;
    kiln::Executor exe = compile_with_tuning(step, file, 0.001);
    CHECK(exe.report().tuning.note.find("is not a kiln tuning cache") != std::string::npos);
    CHECK(exe.report().tuning.note.find(file.string()) != std::string::npos);
    CHECK(file_text(file) == text);
  }
}

TEST_CASE("tuner: the cache key names the machine, threads and graph") {
  const kiln::Target& target = kiln::cpu_backend().target();
  LenetStep a(16), b(32);
  const std::string key = kiln::TuningCache::key(target, 2, a.graph, "");
  CHECK(key.find(kiln::cpu_model_name()) != std::string::npos);
  CHECK(key.find(target.isa) != std::string::npos);
  CHECK(key != kiln::TuningCache::key(target, 1, a.graph, ""));
  CHECK(key != kiln::TuningCache::key(target, 2, b.graph, ""));
  CHECK(key != kiln::TuningCache::key(target, 2, a.graph, "layout"));
  CHECK(key == kiln::TuningCache::key(target, 2, LenetStep(16).graph, ""));
}

TEST_CASE("tuner: bad tuning options are errors naming the option") {
  LenetStep step;
  for (const double seconds : {0.0, -1.0, std::nan(""), 1e6}) {
    try {
      (void)kiln::compile(step.graph, {.tune = kiln::Tune::quick, .tune_seconds = seconds});
      FAIL("compile accepted tune_seconds " << seconds);
    } catch (const kiln::Error& e) {
      CHECK(e.code() == "kiln.api.argument");
      CHECK(std::string(e.what()).find("tune_seconds") != std::string::npos);
    }
  }
}
