// mnist_train: trains the classic MNIST CNN (or another of kiln::nn::models) with kiln on real
// digits and reports accuracy; `mnist_train --help` lists its flags.
#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/dist/data_parallel.hpp"
#include "kiln/kiln.hpp"
#ifdef KILN_WITH_MPI
#include "kiln/dist/mpi.hpp"
#endif
#include "kiln_tools/command_line.hpp"
#include "kiln_tools/json_output.hpp"
#include "kiln_tools/progress.hpp"
#include "kiln_tools/render.hpp"

#ifndef KILN_MNIST_DIR
#define KILN_MNIST_DIR "data/mnist"
#endif

namespace {

struct Options {
  std::string data = KILN_MNIST_DIR;
  std::string model = "mnist_cnn";
  std::string device = "cpu";
  std::string precision = "f32";
  int epochs = 3;
  int batch = 64;
  double lr = 0.01;
  double lr_decay = 0.7;
  double momentum = 0.9;
  int threads = 0;
  std::uint64_t seed = 1;
  bool smoke = false;
  bool allow_non_finite = false;
  bool profile = false;
  bool explain_fusion = false;
  bool tune = false;
  std::vector<std::string> disable;
  std::string json;
  std::string dot;
  std::string plot;
  std::string save;
  std::int64_t save_every = 0;
  int keep = 3;
  std::string resume;
  bool distributed = false;
  double collective_timeout = 120.0;
};

const std::array<std::string, 3> model_names = {"mnist_cnn", "lenet5", "small_resnet"};

void add_flags(CLI::App& app, Options& o) {
  app.add_option("-d,--data", o.data,
                 "MNIST-format IDX files, plain or .gz (scripts/fetch_mnist.sh builds the "
                 "default; Fashion-MNIST: /usr/share/datasets/fashion-mnist)")
      ->check(CLI::Validator(
          [](std::string& dir) {
            std::error_code ec;
            return std::filesystem::is_directory(dir, ec)
                       ? std::string()
                       : "no directory '" + dir +
                             "' (scripts/fetch_mnist.sh builds data/mnist; apt-get install "
                             "dataset-fashion-mnist installs /usr/share/datasets/fashion-mnist)";
          },
          "DIR"));
  app.add_option("-m,--model", o.model, "the network (kiln::nn::models)")
      ->check(kiln::tools::one_of({model_names.begin(), model_names.end()}, "model"));
  app.add_option("--device", o.device,
                 "where the step runs: cpu, or cuda in a build with kiln's CUDA backend")
      ->check(kiln::tools::one_of({"cpu", "cuda"}, "device"));
  app.add_option("--precision", o.precision,
                 "what convolutions and matmuls multiply in: f32, or bf16 where the device has "
                 "bfloat16 dot products (weights, optimizer state and sums stay FP32)")
      ->check(kiln::tools::one_of({"f32", "bf16"}, "precision"));
  app.add_option("-e,--epochs", o.epochs, "passes over the training set")
      ->check(kiln::tools::integer_in(1, 1000));
  app.add_option("-b,--batch", o.batch, "images per training step")
      ->check(kiln::tools::integer_in(1, 65536));
  app.add_option("-l,--lr", o.lr, "SGD learning rate of the first epoch")
      ->check(kiln::tools::positive_number());
  app.add_option("--lr-decay", o.lr_decay,
                 "the learning rate is multiplied by this after every epoch (0.7 as PyTorch's "
                 "MNIST example's StepLR; 1 keeps it constant)")
      ->check(kiln::tools::positive_number());
  app.add_option("--momentum", o.momentum, "SGD momentum")->check(kiln::tools::number_in(0, 1));
  app.add_option("-t,--threads", o.threads, "worker threads; 0 = every core")
      ->check(kiln::tools::integer_in(0, 1024));
  app.add_option("-s,--seed", o.seed, "seed of the initial weights and the batch order")
      ->check(kiln::tools::unsigned_integer());
  app.add_flag("--smoke", o.smoke,
               "100 steps of one epoch (fewer in a shorter one); fails unless the loss falls by a "
               "fifth (ctest)");
  app.add_flag("-p,--profile", o.profile, "print the kernels that took the most time");
  app.add_flag("--allow-non-finite", o.allow_non_finite,
               "keep training when the loss is NaN or infinite (by default the first such step "
               "stops the run with an error naming it)");
  app.add_flag("--explain-fusion", o.explain_fusion,
               "print every fusion, layout and convolution-algorithm decision with its reason, "
               "every layout transform inserted, and with --tune the candidates' times");
  app.add_flag("--tune", o.tune,
               "before training, time the compiler's uncertain decisions (a layout group NHWC or "
               "NCHW, a convolution Winograd or direct, an epilogue fused or apart) on this "
               "machine, at most 2 s, and keep the "
               "faster; cached in $KILN_TUNING_CACHE, else ~/.cache/kiln/tuning.json");
  app.add_option("--disable", o.disable,
                 "switch optimisations off by name, e.g. --disable fuse_elementwise,layout")
      ->delimiter(',')
      ->check(kiln::tools::one_of(kiln::optimisation_names(), "optimisation"));
  app.add_option("--dot", o.dot,
                 "write the optimised training step as Graphviz text, or rendered when the "
                 "name ends in .svg (fused kernels drawn as clusters)");
  app.add_option("--plot", o.plot, "draw loss and test accuracy per epoch as an SVG file");
  app.add_option("--json", o.json, "write the run's results and per-epoch history (docs/json.md)");
  app.add_option("--save", o.save,
                 "write a checkpoint (safetensors: weights, optimizer state, position) into this "
                 "folder after every epoch");
  app.add_option("--save-every", o.save_every, "with --save, also every N steps (0: per epoch)")
      ->check(kiln::tools::integer_in(0, 1 << 30));
  app.add_option("--keep", o.keep, "with --save, how many of the newest checkpoints to keep")
      ->check(kiln::tools::integer_in(1, 100000));
  app.add_flag("--distributed", o.distributed,
               "data-parallel training over MPI: run under mpirun -np N; every step trains on "
               "N x --batch images, --batch of them on each rank, and averages the gradients");
  app.add_option("--collective-timeout", o.collective_timeout,
                 "with --distributed, seconds an all-reduce may take before a dead or hung rank "
                 "is reported")
      ->check(CLI::Range(0.1, 86400.0));
  app.add_option("--resume", o.resume,
                 "continue from the newest checkpoint in this folder: the same steps, batches "
                 "and weights as a run that never stopped (on the same thread count)");
}

/// The checkpoint written after `step` steps: "step-000000375.safetensors", so that names sort
/// as the steps do.
std::filesystem::path checkpoint_path(const std::string& dir, std::int64_t step) {
  char name[48];
  std::snprintf(name, sizeof name, "step-%09lld.safetensors", static_cast<long long>(step));
  return std::filesystem::path(dir) / name;
}

/// The checkpoints in `dir`, oldest first.
std::vector<std::filesystem::path> checkpoints_in(const std::string& dir) {
  std::vector<std::filesystem::path> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("step-") && name.ends_with(".safetensors")) found.push_back(entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

/// The settings a checkpoint records, so that a resumed run can be checked against them: those
/// that decide what the saved position means (model, batch, training set) must match; the
/// optimizer's may change, with a notice.
std::map<std::string, std::string> run_settings(const Options& o, std::int64_t train_images,
                                                int ranks) {
  const auto number = [](double v) { // the shortest text that reads back as v
    char text[32];
    return std::string(text, std::to_chars(text, text + sizeof text, v).ptr);
  };
  return {{"mnist_train.model", o.model},
          {"mnist_train.batch", std::to_string(o.batch)},
          {"mnist_train.ranks", std::to_string(ranks)},
          {"mnist_train.train_images", std::to_string(train_images)},
          {"mnist_train.lr", number(o.lr)},
          {"mnist_train.lr_decay", number(o.lr_decay)},
          {"mnist_train.momentum", number(o.momentum)}};
}

/// Refuses to resume `file` with another model, batch or training set than it was written
/// with, and says which optimizer settings differ.
void check_resumed_settings(const std::filesystem::path& file,
                            const std::map<std::string, std::string>& saved,
                            const std::map<std::string, std::string>& now) {
  for (const auto& [key, value] : now) {
    const auto found = saved.find(key);
    if (found == saved.end())
      kiln::fail(kiln::errc::argument, "--resume: " + file.string() + " was not written by " +
                                           "mnist_train (its metadata has no " + key + ")");
    if (found->second == value) continue;
    const std::string setting = key.substr(key.find('.') + 1);
    const std::string change =
        setting + " " + found->second + " in the checkpoint, " + value + " on this command line";
    if (setting == "model" || setting == "batch" || setting == "ranks" || setting == "train_images")
      kiln::fail(kiln::errc::argument,
                 "--resume: " + file.string() + ": " + change +
                     " (the saved position counts batches of that model and data)");
    std::fprintf(stderr, "note: resuming with %s\n", change.c_str());
  }
}

/// Writes the training state at `info` and keeps only the newest `keep` checkpoints. On a GPU,
/// the host copies of the parameters must be current (Executor::download_params).
void save_checkpoint(const Options& o, const std::vector<kiln::nn::Parameter>& state,
                     const kiln::CheckpointInfo& info) {
  kiln::save_checkpoint(checkpoint_path(o.save, info.step), state, info);
  std::vector<std::filesystem::path> all = checkpoints_in(o.save);
  for (std::size_t i = 0; i + static_cast<std::size_t>(o.keep) < all.size(); ++i)
    std::filesystem::remove(all[i]);
}

/// The network called `name` among kiln::nn::models.
kiln::nn::Sequential make_model(const std::string& name) {
  if (name == "mnist_cnn") return kiln::nn::models::mnist_cnn();
  if (name == "lenet5") return kiln::nn::models::lenet5();
  if (name == "small_resnet") return kiln::nn::models::small_resnet();
  kiln::fail(kiln::errc::argument,
             "unknown model '" + name + "' (mnist_cnn, lenet5 or small_resnet)");
}

/// Test accuracy in percent, evaluated in batches of `batch` (the last one zero-padded); with
/// `world`, each rank evaluates its share of every batch and the counts are summed.
double evaluate(kiln::Executor& exe, kiln::Value logits, const kiln::data::Dataset& test,
                std::int64_t batch, kiln::data::Normalization normalization,
                kiln::Communicator* world) {
  kiln::data::BatchLoader loader(test, {.batch_size = batch,
                                        .shuffle = false,
                                        .normalization = normalization,
                                        .rank = world ? world->rank() : 0,
                                        .ranks = world ? world->size() : 1});
  std::vector<float> images(static_cast<std::size_t>(loader.batch_image_elements()));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  std::int64_t correct = 0;
  for (std::int64_t b = 0; b < loader.batches(); ++b) {
    const std::int64_t real = loader.fill(b, images, labels);
    exe.set_input("x", images);
    exe.run();
    correct += kiln::count_correct(exe.output(logits), labels, real, 10);
  }
  std::vector<double> total{static_cast<double>(correct)};
  if (world) world->sum(total);
  return 100.0 * total[0] / static_cast<double>(test.count);
}

/// One epoch's results, for the console, the JSON history and the plot.
struct Epoch {
  int number = 0;
  double learning_rate = 0, loss = 0, test_accuracy_percent = 0, seconds = 0, images_per_s = 0;
};

/// Loss and test accuracy per epoch on two axes, as gnuplot draws them.
std::string curves_script(const std::vector<Epoch>& history, const std::string& title) {
  std::ostringstream script;
  script << "$history << EOD\n";
  for (const Epoch& e : history)
    script << e.number << ' ' << e.loss << ' ' << e.test_accuracy_percent << '\n';
  script << "EOD\n"
         << "set title " << kiln::tools::gnuplot_quoted(title) << "\n"
         << "set xlabel 'epoch'\nset xtics 1\nset grid\nset key center right\n"
         << "set ylabel 'mean training loss'\nset y2label 'test accuracy (%)'\n"
         << "set ytics nomirror\nset y2tics\n"
         << "plot $history using 1:2 with linespoints lw 2 title 'loss', "
            "$history using 1:3 axes x1y2 with linespoints lw 2 title 'test accuracy'\n";
  return script.str();
}

void explain_decisions(const kiln::Executor& step) {
  std::printf("fusion decisions (pass: producer -> consumer: reason), numbered as in the graph "
              "each pass saw:\n");
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
    std::printf("  %%%d %s -> %s, %lld elements: %s%s%s\n", t.of, t.from.c_str(), t.to.c_str(),
                static_cast<long long>(t.elements), t.why.c_str(),
                t.folded_into.empty() ? "" : "; folded into ", t.folded_into.c_str());
  std::printf("convolution algorithms (Winograd's predicted time over the direct kernel's):\n");
  for (const kiln::AlgorithmDecision& d : step.report().algorithms)
    std::printf("  %s %%%d: %s (%.2f)%s\n", d.op.c_str(), d.node, d.algorithm.c_str(),
                d.winograd_relative, d.measured ? ", measured by the tuner" : "");
  const kiln::TuningReport& tuning = step.report().tuning;
  if (!tuning.ran) return;
  std::printf("tuned decisions (ms per step of the kernels each choice changes: cost model, then "
              "measured; - where the model settled it):\n");
  for (const kiln::TunedDecision& d : tuning.decisions) {
    std::printf("  %-22s %s: rule %s, kept %s\n", d.key.c_str(), d.description.c_str(),
                d.rule.c_str(), d.chosen.c_str());
    for (const kiln::TuningCandidate& c : d.candidates) {
      std::printf("      %-6s model %8.3f", c.choice.c_str(), c.predicted_ms);
      if (c.measured_ms >= 0.0) {
        std::printf("  measured %8.3f\n", c.measured_ms);
      } else {
        std::printf("  measured        -\n");
      }
    }
  }
}

/// One line on what --tune did.
void print_tuning(const kiln::TuningReport& t) {
  if (!t.ran) return;
  if (t.from_cache) {
    std::printf("tuning read from %s in %.1f ms (when it was measured: step %.2f ms by the "
                "rules, %.2f ms tuned; %s)\n",
                t.cache_file.c_str(), 1e3 * t.seconds, t.rules_ms, t.tuned_ms, t.note.c_str());
  } else {
    std::printf("tuned in %.2f s: step %.2f ms by the rules, %.2f ms tuned; %s\n", t.seconds,
                t.rules_ms, t.tuned_ms, t.note.c_str());
  }
}

void write_dot(const kiln::Executor& step, const std::string& path) {
  const std::string dot = kiln::to_dot(*step.report().optimised);
  if (kiln::tools::is_svg(path)) {
    kiln::tools::render_dot_svg(dot, path);
    std::printf("wrote %s\n", path.c_str());
    return;
  }
  std::ofstream out(path);
  out << dot;
  if (!out.flush()) kiln::fail(kiln::errc::io, "--dot: cannot write '" + path + "'");
  std::printf("wrote %s (render: dot -Tsvg %s -o step.svg)\n", path.c_str(), path.c_str());
}

/// The ranks mpirun started, or a clear error where this program was built without MPI.
std::shared_ptr<kiln::Communicator> start_world(const Options& o) {
#ifdef KILN_WITH_MPI
  return kiln::dist::Mpi::start({.timeout_seconds = o.collective_timeout});
#else
  (void)o;
  kiln::fail(kiln::errc::dist_unavailable,
             "--distributed: this mnist_train was built without MPI (Debian: apt-get install "
             "libopenmpi-dev openmpi-bin, then configure and build again)");
#endif
}

int run(const Options& o) {
  const std::shared_ptr<kiln::Communicator> world = o.distributed ? start_world(o) : nullptr;
  const int rank = world ? world->rank() : 0, ranks = world ? world->size() : 1;
  // Rank 0 reports and writes files; the others train in silence (errors still reach stderr).
  if (rank != 0 && !std::freopen("/dev/null", "w", stdout))
    kiln::fail(kiln::errc::io, "cannot silence rank " + std::to_string(rank));
  // Everything that could fail after training is checked first.
  const kiln::tools::JsonOutput json(o.json);
  if (kiln::tools::is_svg(o.dot)) kiln::tools::require_program("dot", "graphviz", "--dot");
  if (!o.plot.empty()) {
    kiln::tools::require_program("gnuplot", "gnuplot-nox", "--plot");
    kiln::tools::require_writable(o.plot, "--plot");
  }

  // Fashion-MNIST has other pixel statistics; the path tells which data set this is.
  const bool fashion = o.data.find("fashion") != std::string::npos;
  const auto normalization =
      fashion ? kiln::data::fashion_mnist_normalization : kiln::data::mnist_normalization;
  const kiln::data::Dataset train = kiln::data::load_mnist(o.data, kiln::data::Split::train);
  const kiln::data::Dataset test = kiln::data::load_mnist(o.data, kiln::data::Split::test);
  std::printf("kiln mnist_train: %lld train / %lld test images from %s\n",
              static_cast<long long>(train.count), static_cast<long long>(test.count),
              o.data.c_str());
  if (ranks > 1)
    std::printf("data parallel: %d ranks x %d images = %lld images per step\n", ranks, o.batch,
                static_cast<long long>(o.batch) * ranks);
  const std::int64_t full_batches = train.count / (static_cast<std::int64_t>(o.batch) * ranks);
  const std::int64_t steps_per_epoch =
      o.smoke ? std::min<std::int64_t>(100, full_batches) : full_batches;
  const std::int64_t least_steps = o.smoke ? 10 : 1;
  if (steps_per_epoch < least_steps)
    kiln::fail(kiln::errc::argument,
               "--batch: " + std::to_string(o.batch) + " images per step leave " +
                   std::to_string(steps_per_epoch) + " steps per epoch of the " +
                   std::to_string(train.count) + " training images (at least " +
                   std::to_string(least_steps) + " needed)");

  kiln::nn::manual_seed(o.seed);
  kiln::nn::Sequential net = make_model(o.model);

  if (o.smoke && !o.resume.empty())
    kiln::fail(kiln::errc::argument, "--resume: not with --smoke, whose 100 steps judge the loss");
  if (!o.save.empty() && rank == 0) {
    std::error_code ec;
    std::filesystem::create_directories(o.save, ec);
    if (ec)
      kiln::fail(kiln::errc::argument, "--save: cannot create '" + o.save + "': " + ec.message());
  }
  kiln::Graph train_graph;
  const auto x = train_graph.input("x", {o.batch, 1, train.height, train.width});
  const auto y = train_graph.input("y", {o.batch}, kiln::i32);
  const auto loss = kiln::softmax_cross_entropy(net(x), y);
  const kiln::TrainStep training = kiln::train_step(
      loss, net.parameters(),
      kiln::optim::SGD{.lr = static_cast<float>(o.lr), .momentum = static_cast<float>(o.momentum)},
      {.communicator = world});
  const std::vector<kiln::nn::Parameter> state = kiln::training_state(net, training);
  const int epochs = o.smoke ? 1 : o.epochs;
  const std::map<std::string, std::string> settings = run_settings(o, train.count, ranks);
  // What must be the same on every rank: the batchnorm statistics are each rank's own.
  std::vector<kiln::nn::Parameter> shared = net.parameters();
  shared.insert(shared.end(), training.optimizer.tensors.begin(), training.optimizer.tensors.end());
  kiln::CheckpointInfo start{.seed = o.seed};
  if (!o.resume.empty()) {
    const std::vector<std::filesystem::path> found = checkpoints_in(o.resume);
    if (found.empty())
      kiln::fail(kiln::errc::argument,
                 "--resume: no checkpoint (step-*.safetensors) in '" + o.resume + "'");
    check_resumed_settings(found.back(), kiln::read_checkpoint_info(found.back()).metadata,
                           settings);
    start = kiln::load_checkpoint(found.back(), state);
    if (start.epoch >= epochs)
      kiln::fail(kiln::errc::argument, "--resume: " + found.back().string() + " ends epoch " +
                                           std::to_string(start.epoch) + ", and --epochs is " +
                                           std::to_string(epochs));
    std::printf("resumed from %s: step %lld, epoch %lld, batch %lld, seed %llu\n",
                found.back().c_str(), static_cast<long long>(start.step),
                static_cast<long long>(start.epoch + 1), static_cast<long long>(start.batch),
                static_cast<unsigned long long>(start.seed));
  }
  if (world) { // every rank starts from rank 0's weights (its initialisation or checkpoint)
    kiln::dist::broadcast_parameters(*world, state);
    kiln::dist::check_same_parameters(*world, shared, "at the start");
  }
  const kiln::Backend& backend = kiln::backend_named(o.device);
  const kiln::Precision precision =
      o.precision == "bf16" ? kiln::Precision::bf16 : kiln::Precision::f32;
  kiln::Executor step = kiln::compile(train_graph, backend,
                                      {.threads = o.threads,
                                       .profile = o.profile,
                                       .disable = o.disable,
                                       .check_finite = !o.allow_non_finite,
                                       .tune = o.tune ? kiln::Tune::quick : kiln::Tune::off,
                                       .precision = precision});
  // Measured before training, so the measurement neither slows nor is slowed by the steps.
  const kiln::MachinePeak peak = o.profile ? kiln::machine_peak(step.plan()) : kiln::MachinePeak{};

  net.eval();
  const std::int64_t eval_batch = 500;
  kiln::Graph eval_graph;
  const auto logits = net(eval_graph.input("x", {eval_batch, 1, test.height, test.width}));
  eval_graph.mark_output(logits);
  kiln::Executor eval = kiln::compile(
      eval_graph, backend, {.threads = o.threads, .disable = o.disable, .precision = precision});

  const kiln::Plan& plan = step.plan();
  std::printf("compiled step: %zu kernels, arena %.1f MiB (unshared %.1f MiB, unoptimised step "
              "%.1f MiB), %s, %d threads, %s, products in %s\n",
              plan.steps.size(), static_cast<double>(plan.memory.arena_bytes) / 1048576.0,
              static_cast<double>(plan.memory.naive_bytes) / 1048576.0,
              static_cast<double>(plan.unoptimised_bytes) / 1048576.0, plan.target.backend.c_str(),
              plan.threads, plan.target.isa.c_str(), o.precision.c_str());
  print_tuning(step.report().tuning);
  if (o.explain_fusion) explain_decisions(step);
  if (!o.dot.empty()) write_dot(step, o.dot);
  std::fflush(stdout);

  kiln::data::BatchLoader loader(train, {.batch_size = o.batch,
                                         .seed = start.seed,
                                         .drop_last = true,
                                         .normalization = normalization,
                                         .rank = rank,
                                         .ranks = ranks});
  std::vector<float> images(static_cast<std::size_t>(loader.batch_image_elements()));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(o.batch));

  std::vector<Epoch> history;
  std::vector<float> losses;
  for (int epoch = static_cast<int>(start.epoch); epoch < epochs; ++epoch) {
    loader.start_epoch(epoch);
    const std::int64_t first = epoch == start.epoch ? start.batch : 0;
    training.set_learning_rate(
        static_cast<float>(o.lr * std::pow(o.lr_decay, static_cast<double>(epoch))));
    // A GPU holds its own copy of every parameter: the new rate reaches it by upload (the host
    // copies are current, downloaded for the last evaluation; both calls do nothing on the CPU).
    step.upload_params();
    kiln::tools::Progress progress(stdout, steps_per_epoch - first, o.batch);
    double loss_sum = 0.0, seconds = 0.0;
    for (std::int64_t b = first; b < steps_per_epoch; ++b) {
      loader.fill(b, images, labels);
      const auto t0 = std::chrono::steady_clock::now();
      step.set_input("x", images);
      step.set_input("y", labels);
      step.run();
      // Reading the loss waits for the step: on a GPU, run() returns before the work is done.
      const float l = step.scalar(loss);
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      loss_sum += l;
      losses.push_back(l);
      char detail[32];
      std::snprintf(detail, sizeof detail, "loss %.4f",
                    loss_sum / static_cast<double>(b + 1 - first));
      progress.update(b + 1 - first, detail);
      const std::int64_t done = epoch * steps_per_epoch + b + 1;
      if (!o.save.empty() && rank == 0 && o.save_every > 0 && done % o.save_every == 0 &&
          b + 1 < steps_per_epoch) {
        step.download_params();
        save_checkpoint(o, state,
                        {.step = done,
                         .epoch = epoch,
                         .batch = b + 1,
                         .seed = start.seed,
                         .metadata = settings});
      }
    }
    progress.finish();
    step.download_params();
    eval.upload_params();
    if (world)
      kiln::dist::check_same_parameters(*world, shared, "after epoch " + std::to_string(epoch + 1));
    if (!o.save.empty() && rank == 0)
      save_checkpoint(o, state,
                      {.step = (epoch + 1) * steps_per_epoch,
                       .epoch = epoch + 1,
                       .seed = start.seed,
                       .metadata = settings});
    const std::int64_t steps_run = steps_per_epoch - first;
    // Each rank's mean loss and images/s, summed over the ranks (slot r holds rank r's rate).
    std::vector<double> totals(static_cast<std::size_t>(ranks) + 1, 0.0);
    totals[0] = loss_sum / static_cast<double>(steps_run);
    totals[static_cast<std::size_t>(rank) + 1] = static_cast<double>(steps_run * o.batch) / seconds;
    if (world) world->sum(totals);
    Epoch e{.number = epoch + 1,
            .learning_rate = training.learning_rate(),
            .loss = totals[0] / ranks,
            .test_accuracy_percent =
                evaluate(eval, logits, test, eval_batch, normalization, world.get()),
            .seconds = seconds,
            .images_per_s = 0.0};
    for (int r = 0; r < ranks; ++r) e.images_per_s += totals[static_cast<std::size_t>(r) + 1];
    if (ranks > 1) {
      std::printf("  images/s per rank:");
      for (int r = 0; r < ranks; ++r)
        std::printf(" %d: %.0f", r, totals[static_cast<std::size_t>(r) + 1]);
      std::printf("; all ranks: %.0f\n", e.images_per_s);
    }
    std::printf(
        "epoch %d/%d  lr %.4g  loss %.4f  test accuracy %.2f%%  %.0f images/s  %.2f ms/step\n",
        e.number, epochs, e.learning_rate, e.loss, e.test_accuracy_percent, e.images_per_s,
        1000.0 * seconds / static_cast<double>(steps_run));
    std::fflush(stdout); // visible per epoch also when piped to a log
    history.push_back(e);
  }
  double total_seconds = 0.0;
  for (const Epoch& e : history) total_seconds += e.seconds;
  const std::int64_t total_steps = steps_per_epoch * epochs - start.step; // run by this process

  // Every collective of the run, on this rank (rank 0 prints): the time all-reduces were in
  // flight, and how much of it the step spent waiting rather than computing.
  const kiln::CollectiveTimes collectives = world ? world->take_times() : kiln::CollectiveTimes{};
  const auto per_step_ms = [&](double s) { return 1000.0 * s / static_cast<double>(total_steps); };
  if (o.profile) {
    kiln::print_profile(stdout, step, peak);
    if (world)
      std::printf("all-reduce, rank 0: %.1f per step, in flight %.3f ms per step, of which "
                  "waited %.3f ms and overlapped with compute %.3f ms (%.0f%% hidden)\n",
                  static_cast<double>(collectives.collectives) / static_cast<double>(total_steps),
                  per_step_ms(collectives.in_flight_seconds),
                  per_step_ms(collectives.waited_seconds),
                  per_step_ms(collectives.in_flight_seconds - collectives.waited_seconds),
                  100.0 * collectives.hidden_share());
  }
  if (json.wanted()) {
    nlohmann::json results = {
        {"program", "mnist_train"},
        {"kiln_version", KILN_VERSION},
        {"model", o.model},
        {"data", o.data},
        {"batch", o.batch},
        {"ranks", ranks},
        {"device", plan.target.backend},
        {"threads", plan.threads},
        {"target", plan.target.isa},
        {"precision", o.precision},
        {"seed", o.seed},
        {"disabled", o.disable},
        {"epochs", epochs},
        {"steps", total_steps},
        {"test_accuracy_percent", history.back().test_accuracy_percent},
        {"final_loss", history.back().loss},
        {"images_per_s", static_cast<double>(total_steps * o.batch * ranks) / total_seconds},
        {"ms_per_step", 1000.0 * total_seconds / static_cast<double>(total_steps)},
        {"history", nlohmann::json::array()}};
    if (world)
      results["allreduce"] = {{"per_step", static_cast<double>(collectives.collectives) /
                                               static_cast<double>(total_steps)},
                              {"in_flight_ms_per_step", per_step_ms(collectives.in_flight_seconds)},
                              {"waited_ms_per_step", per_step_ms(collectives.waited_seconds)},
                              {"hidden_share", collectives.hidden_share()}};
    for (const Epoch& e : history)
      results["history"].push_back({{"epoch", e.number},
                                    {"learning_rate", e.learning_rate},
                                    {"loss", e.loss},
                                    {"test_accuracy_percent", e.test_accuracy_percent},
                                    {"seconds", e.seconds},
                                    {"images_per_s", e.images_per_s}});
    json.write(results);
  }
  if (!o.plot.empty()) {
    kiln::tools::plot_svg(curves_script(history, "kiln mnist_train: " + o.model), o.plot, "--plot");
    std::printf("wrote %s\n", o.plot.c_str());
  }
  if (o.smoke) {
    // The mean loss of the last five steps must be clearly below that of the first five.
    const auto mean5 = [&](std::size_t from) {
      double sum = 0.0;
      for (std::size_t i = from; i < from + 5; ++i) sum += losses[i];
      return sum / 5.0;
    };
    const double first = mean5(0), last = mean5(losses.size() - 5);
    std::printf("smoke: loss %.4f -> %.4f\n", first, last);
    if (!(last < 0.8 * first)) {
      std::fprintf(stderr, "smoke: the loss did not fall by a fifth\n");
      return 1;
    }
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app("Trains a CNN on MNIST-format digits with kiln and reports test accuracy.",
               "mnist_train");
  kiln::tools::share_conventions(app);
  Options options;
  add_flags(app, options);
  return kiln::tools::run(app, argc, argv, [&] { return run(options); });
}
