// mnist_train: trains the classic MNIST CNN (or another of kiln::nn::models) with kiln on real
// digits and reports accuracy.
//
//   mnist_train [--data DIR] [--model NAME] [--epochs N] [--batch N] [--lr X] [--lr-decay X]
//               [--momentum X] [--threads N] [--seed N] [--smoke] [--profile] [--json FILE]
//               [--explain-fusion] [--dot FILE]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "kiln/kiln.hpp"

#ifndef KILN_MNIST_DIR
#define KILN_MNIST_DIR "data/mnist"
#endif

namespace {

struct Options {
  std::string data = KILN_MNIST_DIR;
  std::string model = "mnist_cnn";
  int epochs = 3;
  int batch = 64;
  float lr = 0.01f;
  float lr_decay = 0.7f;
  float momentum = 0.9f;
  int threads = 0;
  std::uint64_t seed = 1;
  bool smoke = false;
  bool profile = false;
  bool explain_fusion = false;
  std::string json;
  std::string dot;
};

constexpr const char* usage =
    "usage: mnist_train [--data DIR] [--model NAME] [--epochs N] [--batch N] [--lr X]\n"
    "                   [--lr-decay X] [--momentum X] [--threads N] [--seed N] [--smoke]\n"
    "                   [--profile] [--json FILE] [--explain-fusion] [--dot FILE]\n"
    "  --data DIR   MNIST-format IDX files, plain or .gz (default: " KILN_MNIST_DIR ",\n"
    "               fetched by scripts/fetch_mnist.sh; Fashion-MNIST: "
    "/usr/share/datasets/fashion-mnist)\n"
    "  --model NAME mnist_cnn (default), lenet5 or small_resnet (kiln::nn::models)\n"
    "  --lr X       SGD learning rate of the first epoch (default 0.01), momentum 0.9\n"
    "  --lr-decay X the learning rate is multiplied by X after every epoch (default 0.7, as\n"
    "               PyTorch's MNIST example's StepLR; 1 keeps it constant)\n"
    "  --smoke      a few steps on a subset; fails unless the loss falls (used by ctest)\n"
    "  --profile    print the kernels that took the most time\n"
    "  --explain-fusion  print every fusion and layout decision of the training step with its\n"
    "               reason, and every layout transform inserted\n"
    "  --dot FILE   write the optimised training step as Graphviz (fused kernels as clusters);\n"
    "               render with: dot -Tsvg FILE -o step.svg\n"
    "  --json FILE  write test_accuracy, final_loss, epochs, images_per_s, ms_per_step\n";

Options parse(int argc, char** argv) {
  Options o;
  const auto number = [&](int& i, const char* flag) -> std::string {
    if (i + 1 >= argc) kiln::fail(kiln::errc::argument, std::string(flag) + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    try {
      if (a == "--data")
        o.data = number(i, "--data");
      else if (a == "--model")
        o.model = number(i, "--model");
      else if (a == "--epochs")
        o.epochs = std::stoi(number(i, "--epochs"));
      else if (a == "--batch")
        o.batch = std::stoi(number(i, "--batch"));
      else if (a == "--lr")
        o.lr = std::stof(number(i, "--lr"));
      else if (a == "--lr-decay")
        o.lr_decay = std::stof(number(i, "--lr-decay"));
      else if (a == "--momentum")
        o.momentum = std::stof(number(i, "--momentum"));
      else if (a == "--threads")
        o.threads = std::stoi(number(i, "--threads"));
      else if (a == "--seed")
        o.seed = std::stoull(number(i, "--seed"));
      else if (a == "--json")
        o.json = number(i, "--json");
      else if (a == "--smoke")
        o.smoke = true;
      else if (a == "--profile")
        o.profile = true;
      else if (a == "--explain-fusion")
        o.explain_fusion = true;
      else if (a == "--dot")
        o.dot = number(i, "--dot");
      else if (a == "--help" || a == "-h") {
        std::fputs(usage, stdout);
        std::exit(0);
      } else
        kiln::fail(kiln::errc::argument, "unknown option '" + a + "'");
    } catch (const std::logic_error&) { // std::stoi and friends
      kiln::fail(kiln::errc::argument, "bad value '" + std::string(argv[i]) + "' for " + a);
    }
  }
  if (o.epochs < 1 || o.batch < 1 || o.threads < 0 || !(o.lr > 0.0f) || !(o.lr_decay > 0.0f))
    kiln::fail(kiln::errc::argument,
               "--epochs and --batch must be >= 1, --threads >= 0, --lr and --lr-decay > 0");
  return o;
}

/// The network called `name` among kiln::nn::models.
kiln::nn::Sequential make_model(const std::string& name) {
  if (name == "mnist_cnn") return kiln::nn::models::mnist_cnn();
  if (name == "lenet5") return kiln::nn::models::lenet5();
  if (name == "small_resnet") return kiln::nn::models::small_resnet();
  kiln::fail(kiln::errc::argument,
             "unknown model '" + name + "' (mnist_cnn, lenet5 or small_resnet)");
}

/// Test accuracy in percent, evaluated in batches of `batch` (the last one zero-padded).
double evaluate(kiln::Executor& exe, kiln::Value logits, const kiln::data::Dataset& test,
                std::int64_t batch, kiln::data::Normalization normalization) {
  kiln::data::BatchLoader loader(
      test, {.batch_size = batch, .shuffle = false, .normalization = normalization});
  std::vector<float> images(static_cast<std::size_t>(loader.batch_image_elements()));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  std::int64_t correct = 0;
  for (std::int64_t b = 0; b < loader.batches(); ++b) {
    const std::int64_t real = loader.fill(b, images, labels);
    exe.set_input("x", images);
    exe.run();
    correct += kiln::count_correct(exe.output(logits), labels, real, 10);
  }
  return 100.0 * static_cast<double>(correct) / static_cast<double>(test.count);
}

void progress(std::int64_t done, std::int64_t total, double loss) {
  constexpr int width = 30;
  const auto filled = static_cast<int>(width * done / std::max<std::int64_t>(total, 1));
  std::printf("\r  [%.*s%*s] %lld/%lld  loss %.4f", filled,
              "==============================", width - filled, "", static_cast<long long>(done),
              static_cast<long long>(total), loss);
  std::fflush(stdout);
}

int run(const Options& o) {
  // Fashion-MNIST has other pixel statistics; the path tells which data set this is.
  const bool fashion = o.data.find("fashion") != std::string::npos;
  const auto normalization =
      fashion ? kiln::data::fashion_mnist_normalization : kiln::data::mnist_normalization;
  const kiln::data::Dataset train = kiln::data::load_mnist(o.data, kiln::data::Split::train);
  const kiln::data::Dataset test = kiln::data::load_mnist(o.data, kiln::data::Split::test);
  std::printf("kiln mnist_train: %lld train / %lld test images from %s\n",
              static_cast<long long>(train.count), static_cast<long long>(test.count),
              o.data.c_str());

  kiln::nn::manual_seed(o.seed);
  kiln::nn::Sequential net = make_model(o.model);

  kiln::Graph train_graph;
  const auto x = train_graph.input("x", {o.batch, 1, train.height, train.width});
  const auto y = train_graph.input("y", {o.batch}, kiln::i32);
  const auto loss = kiln::softmax_cross_entropy(net(x), y);
  const kiln::TrainStep training = kiln::train_step(
      loss, net.parameters(), kiln::optim::SGD{.lr = o.lr, .momentum = o.momentum});
  kiln::Executor step = kiln::compile(train_graph, {.threads = o.threads, .profile = o.profile});
  // Measured before training, so the measurement neither slows nor is slowed by the steps.
  const kiln::MachinePeak peak = o.profile ? kiln::machine_peak(step.plan()) : kiln::MachinePeak{};

  net.eval();
  const std::int64_t eval_batch = 500;
  kiln::Graph eval_graph;
  const auto logits = net(eval_graph.input("x", {eval_batch, 1, test.height, test.width}));
  eval_graph.mark_output(logits);
  kiln::Executor eval = kiln::compile(eval_graph, {.threads = o.threads});

  const kiln::Plan& plan = step.plan();
  std::printf("compiled step: %zu kernels, arena %.1f MiB (unshared %.1f MiB, unoptimised step "
              "%.1f MiB), %d threads, %s\n",
              plan.steps.size(), static_cast<double>(plan.memory.arena_bytes) / 1048576.0,
              static_cast<double>(plan.memory.naive_bytes) / 1048576.0,
              static_cast<double>(plan.unoptimised_bytes) / 1048576.0, plan.threads,
              plan.target.isa.c_str());
  if (o.explain_fusion) {
    std::printf(
        "fusion decisions (pass: producer -> consumer: reason), numbered as in the graph each "
        "pass saw:\n");
    for (const kiln::FusionDecision& d : step.report().fusion)
      std::printf("  %-16s %%%d %s -> %%%d %s: %s\n", d.pass.c_str(), d.producer,
                  d.producer_op.c_str(), d.consumer, d.consumer_op.c_str(),
                  std::string(kiln::fusion_reason_name(d.reason)).c_str());
    std::printf("layout decisions (activation groups that convolutions touch):\n");
    for (const kiln::LayoutDecision& d : step.report().layouts)
      std::printf("  %s for %zu values from %%%d: %s (saves ~%.1f MiB of column matrices, "
                  "reorders cost ~%.1f MiB)\n",
                  d.layout.c_str(), d.values.size(), d.values.front(),
                  std::string(kiln::layout_reason_name(d.reason)).c_str(),
                  static_cast<double>(d.saved_bytes) / 1048576.0,
                  static_cast<double>(d.reorder_bytes) / 1048576.0);
    std::printf("layout transforms inserted:\n");
    for (const kiln::LayoutTransform& t : step.report().transforms)
      std::printf("  %%%d %s -> %s, %lld elements: %s\n", t.of, t.from.c_str(), t.to.c_str(),
                  static_cast<long long>(t.elements), t.why.c_str());
  }
  if (!o.dot.empty()) {
    std::ofstream out(o.dot);
    out << kiln::to_dot(*step.report().optimised);
    if (!out) kiln::fail(kiln::errc::io, "cannot write " + o.dot);
    std::printf("wrote %s (render: dot -Tsvg %s -o step.svg)\n", o.dot.c_str(), o.dot.c_str());
  }
  std::fflush(stdout);

  kiln::data::BatchLoader loader(
      train,
      {.batch_size = o.batch, .seed = o.seed, .drop_last = true, .normalization = normalization});
  std::vector<float> images(static_cast<std::size_t>(loader.batch_image_elements()));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(o.batch));
  const bool tty = isatty(fileno(stdout)) != 0;
  const int epochs = o.smoke ? 1 : o.epochs;
  const std::int64_t steps_per_epoch =
      o.smoke ? std::min<std::int64_t>(30, loader.batches()) : loader.batches();

  double final_loss = 0.0, accuracy = 0.0, total_seconds = 0.0;
  std::int64_t total_steps = 0;
  std::vector<float> smoke_losses;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    loader.start_epoch(epoch);
    training.set_learning_rate(o.lr * std::pow(o.lr_decay, static_cast<float>(epoch)));
    double loss_sum = 0.0, seconds = 0.0;
    for (std::int64_t b = 0; b < steps_per_epoch; ++b) {
      loader.fill(b, images, labels);
      const auto t0 = std::chrono::steady_clock::now();
      step.set_input("x", images);
      step.set_input("y", labels);
      step.run();
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const float l = step.scalar(loss);
      loss_sum += l;
      smoke_losses.push_back(l);
      if (tty && (b % 10 == 9 || b + 1 == steps_per_epoch))
        progress(b + 1, steps_per_epoch, loss_sum / double(b + 1));
    }
    if (tty) std::printf("\r%80s\r", "");
    final_loss = loss_sum / static_cast<double>(steps_per_epoch);
    total_seconds += seconds;
    total_steps += steps_per_epoch;
    accuracy = evaluate(eval, logits, test, eval_batch, normalization);
    std::printf(
        "epoch %d/%d  lr %.4g  loss %.4f  test accuracy %.2f%%  %.0f images/s  %.2f ms/step\n",
        epoch + 1, epochs, static_cast<double>(training.learning_rate()), final_loss, accuracy,
        static_cast<double>(steps_per_epoch * o.batch) / seconds,
        1000.0 * seconds / static_cast<double>(steps_per_epoch));
    std::fflush(stdout); // visible per epoch also when piped to a log
  }
  const double ms_per_step = 1000.0 * total_seconds / static_cast<double>(total_steps);
  const double images_per_s = static_cast<double>(total_steps * o.batch) / total_seconds;

  if (o.profile) kiln::print_profile(stdout, step, peak);
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    out << "{\"model\": \"" << o.model << "\", \"test_accuracy\": " << accuracy / 100.0
        << ", \"final_loss\": " << final_loss << ", \"epochs\": " << epochs
        << ", \"images_per_s\": " << images_per_s << ", \"ms_per_step\": " << ms_per_step
        << ", \"batch\": " << o.batch << ", \"threads\": " << plan.threads << ", \"target\": \""
        << plan.target.isa << "\", \"seed\": " << o.seed << ", \"steps\": " << total_steps << "}\n";
    if (!out) kiln::fail(kiln::errc::io, "cannot write " + o.json);
  }
  if (o.smoke) {
    // The mean loss of the last five steps must be clearly below that of the first five.
    const auto mean5 = [&](std::size_t from) {
      double s = 0.0;
      for (std::size_t i = from; i < from + 5; ++i) s += smoke_losses[i];
      return s / 5.0;
    };
    const double first = mean5(0), last = mean5(smoke_losses.size() - 5);
    std::printf("smoke: loss %.4f -> %.4f\n", first, last);
    if (!(last < 0.8 * first)) {
      std::fprintf(stderr, "smoke: the loss did not fall\n");
      return 1;
    }
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "mnist_train: %s\n", e.what());
    if (e.code() == kiln::errc::argument) std::fputs(usage, stderr);
    return 2;
  }
}
