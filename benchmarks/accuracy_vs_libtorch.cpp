// accuracy_vs_libtorch: trains one network with kiln and with libtorch at identical settings for
// several seeds, both reading the same batches in the same order for a seed, and prints each
// run's test accuracy per epoch, each library's mean and standard deviation, and the difference
// of the means with two 95% confidence intervals: Welch's t over the two groups, and Student's t
// over the differences of runs paired by seed (the same batches, so the data order's effect
// cancels). `accuracy_vs_libtorch --help` lists its flags.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "kiln/kiln.hpp"
#include "kiln_tools/json_output.hpp"
#include "torch_reference.hpp"

namespace {

struct Settings {
  std::string data = "data/mnist", model = "mnist_cnn", json;
  int seeds = 5, epochs = 3, batch = 64, threads = 2;
  double lr = 0.01, momentum = 0.9, lr_decay = 1.0;
};

/// One training run: test accuracy (percent) and mean training loss after each epoch.
struct Run {
  std::string library;
  std::uint64_t seed = 0;
  std::vector<double> accuracy, loss;
  double seconds = 0.0;
};

/// What both libraries are handed: the data and its normalisation.
struct Data {
  kiln::data::Dataset train, test;
  kiln::data::Normalization normalization;
};

constexpr std::int64_t eval_batch = 500;

/// The learning rate of epoch `epoch` (from 0).
float learning_rate(const Settings& s, int epoch) {
  return static_cast<float>(s.lr * std::pow(s.lr_decay, epoch));
}

/// Test accuracy in percent; `count_batch(images, labels, real)` counts one batch's correct.
double test_accuracy(
    const Data& d,
    const std::function<std::int64_t(const std::vector<float>&, const std::vector<std::int32_t>&,
                                     std::int64_t)>& count_batch) {
  const kiln::data::BatchLoader loader(
      d.test, {.batch_size = eval_batch, .shuffle = false, .normalization = d.normalization});
  std::vector<float> images(static_cast<std::size_t>(loader.batch_image_elements()));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(eval_batch));
  std::int64_t correct = 0;
  for (std::int64_t b = 0; b < loader.batches(); ++b) {
    const std::int64_t real = loader.fill(b, images, labels);
    correct += count_batch(images, labels, real);
  }
  return 100.0 * static_cast<double>(correct) / static_cast<double>(d.test.count);
}

/// Trains for every epoch, calling `train(images, labels)` per batch (it returns the loss)
/// and `evaluate()` after each epoch; `set_rate` gets each epoch's learning rate first.
Run train_run(
    const Settings& s, const Data& d, std::uint64_t seed, const std::string& library,
    const std::function<void(float)>& set_rate,
    const std::function<float(const std::vector<float>&, const std::vector<std::int32_t>&)>& train,
    const std::function<double()>& evaluate) {
  Run run{library, seed, {}, {}, 0.0};
  // The same seed gives both libraries the same batches in the same order.
  kiln::data::BatchLoader loader(
      d.train,
      {.batch_size = s.batch, .seed = seed, .drop_last = true, .normalization = d.normalization});
  std::vector<float> images(static_cast<std::size_t>(loader.batch_image_elements()));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(s.batch));
  for (int epoch = 0; epoch < s.epochs; ++epoch) {
    loader.start_epoch(epoch);
    set_rate(learning_rate(s, epoch));
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0.0;
    for (std::int64_t b = 0; b < loader.batches(); ++b) {
      loader.fill(b, images, labels);
      loss_sum += train(images, labels);
    }
    run.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    run.loss.push_back(loss_sum / static_cast<double>(loader.batches()));
    run.accuracy.push_back(evaluate());
    std::printf("  %-8s seed %llu  epoch %d/%d  loss %.4f  test accuracy %.2f%%\n", library.c_str(),
                static_cast<unsigned long long>(seed), epoch + 1, s.epochs, run.loss.back(),
                run.accuracy.back());
    std::fflush(stdout);
  }
  return run;
}

Run train_kiln(const Settings& s, const Data& d, std::uint64_t seed) {
  kiln::nn::manual_seed(seed);
  kiln::nn::Sequential net = bench::reference_network(s.model);
  const std::int64_t h = d.train.height, w = d.train.width;
  kiln::Graph train_graph;
  const kiln::Value loss =
      kiln::softmax_cross_entropy(net(train_graph.input("x", {s.batch, 1, h, w})),
                                  train_graph.input("y", {s.batch}, kiln::i32));
  const kiln::TrainStep training = kiln::train_step(
      loss, net.parameters(),
      kiln::optim::SGD{.lr = static_cast<float>(s.lr), .momentum = static_cast<float>(s.momentum)});
  kiln::Executor step = kiln::compile(train_graph, {.threads = s.threads});
  net.eval();
  kiln::Graph eval_graph;
  const kiln::Value logits = net(eval_graph.input("x", {eval_batch, 1, h, w}));
  eval_graph.mark_output(logits);
  kiln::Executor eval = kiln::compile(eval_graph, {.threads = s.threads});
  return train_run(
      s, d, seed, "kiln", [&](float rate) { training.set_learning_rate(rate); },
      [&](const std::vector<float>& images, const std::vector<std::int32_t>& labels) {
        step.set_input("x", images);
        step.set_input("y", labels);
        step.run();
        return step.scalar(loss);
      },
      [&] {
        return test_accuracy(d, [&](const std::vector<float>& images,
                                    const std::vector<std::int32_t>& labels, std::int64_t real) {
          eval.set_input("x", images);
          eval.run();
          return kiln::count_correct(eval.output(logits), labels, real, d.test.num_classes);
        });
      });
}

Run train_torch(const Settings& s, const Data& d, std::uint64_t seed) {
  bench::TorchClassifier torch(s.model, seed, static_cast<float>(s.lr),
                               static_cast<float>(s.momentum));
  return train_run(
      s, d, seed, "libtorch", [&](float rate) { torch.set_learning_rate(rate); },
      [&](const std::vector<float>& images, const std::vector<std::int32_t>& labels) {
        return torch.train(images, labels);
      },
      [&] {
        return test_accuracy(
            d, [&](const std::vector<float>& images, const std::vector<std::int32_t>& labels,
                   std::int64_t real) { return torch.correct(images, labels, real); });
      });
}

/// Mean and sample standard deviation.
struct Summary {
  double mean = 0.0, sd = 0.0;
  int n = 0;
};

Summary summarise(const std::vector<double>& v) {
  Summary s{0.0, 0.0, static_cast<int>(v.size())};
  for (double x : v) s.mean += x / static_cast<double>(v.size());
  if (v.size() > 1) {
    for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(s.sd / static_cast<double>(v.size() - 1));
  }
  return s;
}

/// The 97.5% quantile of Student's t with `df` degrees of freedom, rounded down to a whole
/// number of them (a slightly wider, conservative interval); the normal's beyond 30.
double t_quantile_975(double df) {
  static constexpr double table[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306,
                                     2.262,  2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120,
                                     2.110,  2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
                                     2.060,  2.056, 2.052, 2.048, 2.045, 2.042};
  const auto whole = static_cast<int>(std::floor(df));
  if (whole < 1) return table[0];
  return whole <= 30 ? table[whole - 1] : 1.960;
}

/// A difference of means with its 95% confidence interval.
struct Difference {
  double mean = 0.0, low = 0.0, high = 0.0;
};

/// mean(a) - mean(b), independent groups (Welch's t).
Difference welch(const Summary& a, const Summary& b) {
  const double va = a.sd * a.sd / a.n, vb = b.sd * b.sd / b.n;
  const double se = std::sqrt(va + vb);
  const double df =
      se > 0 ? (va + vb) * (va + vb) / (va * va / (a.n - 1) + vb * vb / (b.n - 1)) : 1.0;
  const double half = t_quantile_975(df) * se;
  const double d = a.mean - b.mean;
  return {d, d - half, d + half};
}

/// mean(a - b) over pairs a[i], b[i] (Student's t on the differences).
Difference paired(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  const Summary s = summarise(d);
  const double half = t_quantile_975(s.n - 1) * s.sd / std::sqrt(static_cast<double>(s.n));
  return {s.mean, s.mean - half, s.mean + half};
}

std::vector<double> at_epoch(const std::vector<Run>& runs, const std::string& library, int epoch) {
  std::vector<double> v;
  for (const Run& r : runs)
    if (r.library == library) v.push_back(r.accuracy[static_cast<std::size_t>(epoch)]);
  return v;
}

int run(const Settings& s) {
  const kiln::tools::JsonOutput json(s.json);
  bench::set_torch_threads(s.threads);
  const bool fashion = s.data.find("fashion") != std::string::npos;
  Data d{kiln::data::load_mnist(s.data, kiln::data::Split::train),
         kiln::data::load_mnist(s.data, kiln::data::Split::test),
         fashion ? kiln::data::fashion_mnist_normalization : kiln::data::mnist_normalization};
  if (d.train.height != 28 || d.train.width != 28)
    kiln::fail(kiln::errc::argument, "--data: the networks take 28x28 images; '" + s.data +
                                         "' has " + std::to_string(d.train.height) + "x" +
                                         std::to_string(d.train.width));
  std::printf("%s on %s (%lld train / %lld test images), %d epochs, batch %d, SGD lr %g "
              "momentum %g, lr x%g per epoch, %d threads, %d seeds a side; %s with %s\n",
              s.model.c_str(), s.data.c_str(), static_cast<long long>(d.train.count),
              static_cast<long long>(d.test.count), s.epochs, s.batch, s.lr, s.momentum, s.lr_decay,
              s.threads, s.seeds, bench::torch_version().c_str(),
              bench::libtorch_settings().c_str());
  std::vector<Run> runs;
  for (int seed = 1; seed <= s.seeds; ++seed) {
    runs.push_back(train_kiln(s, d, static_cast<std::uint64_t>(seed)));
    runs.push_back(train_torch(s, d, static_cast<std::uint64_t>(seed)));
  }

  std::printf("\ntest accuracy (%%) after each epoch\n%-18s", "run");
  for (int e = 1; e <= s.epochs; ++e) std::printf("  epoch %-7d", e);
  std::printf("  %9s\n", "minutes");
  for (const Run& r : runs) {
    std::printf("%-9s seed %-3llu", r.library.c_str(), static_cast<unsigned long long>(r.seed));
    for (double a : r.accuracy) std::printf("  %13.2f", a);
    std::printf("  %9.1f\n", r.seconds / 60.0);
  }
  nlohmann::json epochs = nlohmann::json::array();
  for (const std::string library : {"kiln", "libtorch"}) {
    std::printf("%-18s", (library + " mean (sd)").c_str());
    for (int e = 0; e < s.epochs; ++e) {
      const Summary m = summarise(at_epoch(runs, library, e));
      std::printf("  %6.2f (%4.2f)", m.mean, m.sd);
    }
    std::printf("\n");
  }
  std::printf("%-18s", "kiln - libtorch");
  for (int e = 0; e < s.epochs; ++e) {
    const std::vector<double> kiln_runs = at_epoch(runs, "kiln", e),
                              torch_runs = at_epoch(runs, "libtorch", e);
    const Summary k = summarise(kiln_runs), t = summarise(torch_runs);
    const Difference diff = welch(k, t), by_seed = paired(kiln_runs, torch_runs);
    std::printf("%s  %+6.2f", e > 0 ? "       " : "", diff.mean); // under the means
    epochs.push_back({{"epoch", e + 1},
                      {"kiln_mean", k.mean},
                      {"kiln_sd", k.sd},
                      {"libtorch_mean", t.mean},
                      {"libtorch_sd", t.sd},
                      {"difference", diff.mean},
                      {"difference_95_low", diff.low},
                      {"difference_95_high", diff.high},
                      {"paired_95_low", by_seed.low},
                      {"paired_95_high", by_seed.high}});
  }
  const auto print_interval = [&](const char* label, const char* low, const char* high) {
    std::printf("\n%-18s", label);
    for (const auto& e : epochs)
      std::printf("  [%+.2f,%+.2f]", e[low].get<double>(), e[high].get<double>());
  };
  print_interval("  95%, Welch", "difference_95_low", "difference_95_high");
  print_interval("  95%, by seed", "paired_95_low", "paired_95_high");
  std::printf("\n");

  nlohmann::json run_rows = nlohmann::json::array();
  for (const Run& r : runs)
    run_rows.push_back({{"library", r.library},
                        {"seed", r.seed},
                        {"test_accuracy_percent", r.accuracy},
                        {"mean_loss", r.loss},
                        {"seconds", r.seconds}});
  json.write({{"benchmark", "accuracy_vs_libtorch"},
              {"network", s.model},
              {"data", s.data},
              {"train_images", d.train.count},
              {"test_images", d.test.count},
              {"batch", s.batch},
              {"lr", s.lr},
              {"momentum", s.momentum},
              {"lr_decay", s.lr_decay},
              {"threads", s.threads},
              {"torch", bench::torch_version()},
              {"runs", run_rows},
              {"epochs", epochs}});
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  bench::run_libtorch_at_its_best(argv);
  CLI::App app("Trains one network with kiln and with libtorch at identical settings for "
               "several seeds, and compares their test accuracy.",
               "accuracy_vs_libtorch");
  kiln::tools::share_conventions(app);
  Settings s;
  app.add_option("-d,--data", s.data,
                 "folder of MNIST-format data (e.g. /usr/share/datasets/fashion-mnist)");
  bench::add_model_flag(app, s.model);
  app.add_option("--seeds", s.seeds, "runs per library, seeds 1..N")
      ->check(kiln::tools::integer_in(2, 1000));
  app.add_option("-e,--epochs", s.epochs, "passes over the training set")
      ->check(kiln::tools::integer_in(1, 1000));
  app.add_option("-b,--batch", s.batch, "images per training step")
      ->check(kiln::tools::integer_in(1, 4096));
  app.add_option("-l,--lr", s.lr, "SGD learning rate")->check(kiln::tools::positive_number());
  app.add_option("--momentum", s.momentum, "SGD momentum")->check(kiln::tools::number_in(0, 1));
  app.add_option("--lr-decay", s.lr_decay, "learning rate factor per epoch (1: constant)")
      ->check(kiln::tools::positive_number())
      ->check(kiln::tools::number_in(0, 1));
  app.add_option("-t,--threads", s.threads, "worker threads of each library")
      ->check(kiln::tools::integer_in(1, 1024));
  app.add_option("--json", s.json, "write every run and the summary as JSON (docs/json.md)");
  return kiln::tools::run(app, argc, argv, [&] { return run(s); });
}
