// checkpoint_logits: prints kiln's logits for the first test images from a mnist_train checkpoint.
//   checkpoint_logits CHECKPOINT DATA_DIR MODEL COUNT
// MODEL is mnist_cnn or lenet5; the pixels are byte/255 with no other normalisation; each of
// the COUNT lines holds 10 logits ("%.9g", separated by spaces). scripts/checkpoint_logits.py
// computes the same numbers from the file without kiln (tests/programs/check_checkpoint_reader.sh).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"

namespace {

kiln::nn::Sequential make_model(const std::string& name) {
  if (name == "mnist_cnn") return kiln::nn::models::mnist_cnn();
  if (name == "lenet5") return kiln::nn::models::lenet5();
  kiln::fail(kiln::errc::argument, "unknown model '" + name + "' (mnist_cnn or lenet5)");
}

std::int64_t parse_count(const std::string& text) {
  char* end = nullptr;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || n < 1 || n > 100000)
    kiln::fail(kiln::errc::argument, "COUNT must be an integer in [1, 100000], got '" + text + "'");
  return n;
}

int run(const std::string& checkpoint, const std::string& data, const std::string& model,
        std::int64_t count) {
  const kiln::data::Dataset test = kiln::data::load_mnist(data, kiln::data::Split::test);
  if (count > test.count)
    kiln::fail(kiln::errc::argument, "COUNT " + std::to_string(count) + " exceeds the " +
                                         std::to_string(test.count) + " test images in " + data);

  kiln::nn::Sequential net = make_model(model);
  // The file holds the optimizer's state too; only the network's tensors are read.
  kiln::load_checkpoint(checkpoint, kiln::model_state(net), {.skip_unlisted = true});

  net.eval();
  kiln::Graph eval_graph;
  const auto logits = net(eval_graph.input("x", {count, 1, test.height, test.width}));
  eval_graph.mark_output(logits);
  kiln::Executor eval = kiln::compile(eval_graph, kiln::backend_named("cpu"), {.threads = 1});
  const auto pixels = static_cast<std::size_t>(count * test.image_size());
  // Dataset pixels are already byte/255.0f.
  eval.set_input("x", std::span<const float>(test.images.data(), pixels));
  eval.run();
  const std::span<const float> out = eval.output(logits);
  if (out.size() != static_cast<std::size_t>(count) * 10)
    kiln::fail(kiln::errc::argument, "the model gave " + std::to_string(out.size()) +
                                         " logits for " + std::to_string(count) + " images");
  for (std::int64_t i = 0; i < count; ++i)
    for (int c = 0; c < 10; ++c)
      std::printf("%.9g%c", static_cast<double>(out[static_cast<std::size_t>(i * 10 + c)]),
                  c == 9 ? '\n' : ' ');
  return std::fflush(stdout) == 0 ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: checkpoint_logits CHECKPOINT DATA_DIR MODEL COUNT\n");
    return 2;
  }
  try {
    return run(argv[1], argv[2], argv[3], parse_count(argv[4]));
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "checkpoint_logits: %s\n", e.what());
    return 1;
  }
}
