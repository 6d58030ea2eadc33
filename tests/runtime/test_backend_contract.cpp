// The backend contract holds a second backend without a change to passes, ops or the
// executor: a device whose memory is its own (what a GPU is to the executor) trains the same
// step as the CPU, bit for bit, reaching the host only through copies; a target without
// channels-last kernels keeps the layout pass from making any.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"

#include "support/graph_test_helpers.hpp"

namespace {

/// What a SeparateMemoryDevice was asked to do.
struct Traffic {
  int copies_in = 0, copies_out = 0, allocations = 0, frees = 0;
};

/// A device with memory of its own: the CPU's kernels run on it, but the host reaches it only
/// through copy_in and copy_out, which it counts; new memory is filled with NaN so that a
/// value the executor failed to copy there shows.
class SeparateMemoryDevice final : public kiln::Device {
public:
  SeparateMemoryDevice(std::unique_ptr<kiln::Device> cpu, Traffic& traffic)
      : cpu_(std::move(cpu)), traffic_(traffic) {}
  [[nodiscard]] int workers() const override { return cpu_->workers(); }
  [[nodiscard]] bool shares_host_memory() const override { return false; }
  [[nodiscard]] std::byte* allocate(std::size_t bytes) override {
    ++traffic_.allocations;
    std::byte* memory = cpu_->allocate(bytes);
    std::fill_n(reinterpret_cast<float*>(memory), bytes / sizeof(float),
                std::numeric_limits<float>::quiet_NaN());
    return memory;
  }
  void free(std::byte* memory) noexcept override {
    ++traffic_.frees;
    cpu_->free(memory);
  }
  void copy_in(std::byte* device, const void* host, std::size_t bytes) override {
    ++traffic_.copies_in;
    cpu_->copy_in(device, host, bytes);
  }
  void copy_out(void* host, const std::byte* device, std::size_t bytes) override {
    ++traffic_.copies_out;
    cpu_->copy_out(host, device, bytes);
  }
  void fill(std::byte* device, std::byte value, std::size_t bytes) override {
    cpu_->fill(device, value, bytes);
  }
  void run(std::span<const kiln::KernelFn> kernels, std::span<const kiln::KernelArgs> args,
           std::span<double> seconds) override {
    cpu_->run(kernels, args, seconds);
  }
  void synchronize() override { cpu_->synchronize(); }
  [[nodiscard]] double seconds() override { return cpu_->seconds(); }

private:
  std::unique_ptr<kiln::Device> cpu_;
  Traffic& traffic_;
};

/// The CPU's kernels behind a device with memory of its own, on a target that describes no
/// channels-last kernels.
class SeparateMemoryBackend final : public kiln::Backend {
public:
  explicit SeparateMemoryBackend(Traffic& traffic) : traffic_(traffic) {
    target_.backend = "separate";
    target_.isa = kiln::cpu_backend().target().isa;
    target_.default_threads = 1;
  }
  [[nodiscard]] const kiln::Target& target() const override { return target_; }
  [[nodiscard]] kiln::KernelChoice select(const kiln::KernelQuery& q) const override {
    return kiln::cpu_backend().select(q);
  }
  [[nodiscard]] std::unique_ptr<kiln::Device> open(int workers) const override {
    return std::make_unique<SeparateMemoryDevice>(kiln::cpu_backend().open(workers), traffic_);
  }

private:
  Traffic& traffic_;
  kiln::Target target_;
};

/// A small CNN's training step (16 channels, so the CPU target runs it channels-last), with
/// parameters seeded the same every call.
struct Step {
  kiln::Graph g;
  kiln::nn::Sequential net;
  kiln::TrainStep step;
  Step() : net(make()), step(build(g, net)) {}
  static kiln::nn::Sequential make() {
    kiln::nn::manual_seed(5);
    return kiln::nn::Sequential{kiln::nn::Conv2d(1, 16, 3),      kiln::nn::ReLU(),
                                kiln::nn::Conv2d(16, 16, 3),     kiln::nn::ReLU(),
                                kiln::nn::MaxPool2d(2),          kiln::nn::Flatten(),
                                kiln::nn::Linear(16 * 5 * 5, 10)};
  }
  static kiln::TrainStep build(kiln::Graph& g, kiln::nn::Sequential& net) {
    auto x = g.input("x", {4, 1, 14, 14});
    auto y = g.input("y", {4}, kiln::i32);
    return kiln::train_step(kiln::softmax_cross_entropy(net(x), y), net.parameters(),
                            kiln::optim::SGD{.lr = 0.05f, .momentum = 0.9f});
  }
  [[nodiscard]] std::vector<float> weights() const {
    std::vector<float> all;
    for (const auto& p : net.parameters())
      all.insert(all.end(), p.tensor->f32().begin(), p.tensor->f32().end());
    return all;
  }
};

} // namespace

TEST_CASE("backend contract: a device with its own memory trains as the CPU does, via copies") {
  Traffic traffic;
  const SeparateMemoryBackend separate(traffic);
  Step on_cpu, on_device;
  const std::vector<float> initial = on_device.weights();
  // The separate target has no channels-last kernels: the CPU runs NCHW too, so that both
  // run the same kernels in the same order.
  kiln::Executor cpu =
      kiln::compile(on_cpu.g, kiln::cpu_backend(), {.threads = 1, .disable = {"layout"}});
  kiln::Executor device = kiln::compile(on_device.g, separate, {.threads = 1});
  CHECK(device.plan().target.backend == "separate");
  const std::vector<float> x = kiln::test::random_inputs(4 * 14 * 14, 3);
  const std::vector<std::int32_t> y = {1, 7, 3, 0};
  const int copies_before = traffic.copies_in;
  for (int run = 0; run < 3; ++run) {
    for (kiln::Executor* exe : {&cpu, &device}) {
      exe->set_input("x", x);
      exe->set_input("y", y);
      exe->run();
    }
    CHECK(cpu.scalar(on_cpu.step.loss) == device.scalar(on_device.step.loss));
  }
  CHECK(traffic.copies_in - copies_before == 3 * 2); // x and y, every run
  CHECK(traffic.copies_out == 3);                    // the loss, when read
  // The device trained its own copies: the host tensors change only when asked.
  CHECK(on_device.weights() == initial);
  device.download_params();
  CHECK(on_device.weights() == on_cpu.weights());
  CHECK(on_device.weights() != initial);

  // A host change reaches the device when uploaded: both restart from the same weights.
  for (const auto* s : {&on_cpu, &on_device})
    for (const auto& p : s->net.parameters())
      std::fill(p.tensor->f32().begin(), p.tensor->f32().end(), 0.01f);
  device.upload_params();
  for (kiln::Executor* exe : {&cpu, &device}) exe->run();
  CHECK(cpu.scalar(on_cpu.step.loss) == device.scalar(on_device.step.loss));
}

TEST_CASE("backend contract: the target, not the pass, decides whether convolutions go NHWC") {
  Traffic traffic;
  const SeparateMemoryBackend separate(traffic);
  Step on_cpu, on_device;
  const kiln::Executor cpu = kiln::compile(on_cpu.g, kiln::cpu_backend(), {.threads = 1});
  const kiln::Executor device = kiln::compile(on_device.g, separate, {.threads = 1});
  const auto nhwc_groups = [](const kiln::Executor& exe) {
    int n = 0;
    for (const kiln::LayoutDecision& d : exe.report().layouts) n += d.layout == "NHWC";
    return n;
  };
  CHECK(nhwc_groups(cpu) > 0);
  CHECK(nhwc_groups(device) == 0);
  for (const kiln::LayoutDecision& d : device.report().layouts)
    CHECK(d.reason == kiln::LayoutReason::not_eligible);
}

TEST_CASE("backend contract: an executor returns every allocation to its device") {
  Traffic traffic;
  const SeparateMemoryBackend separate(traffic);
  {
    Step s;
    const kiln::Executor exe = kiln::compile(s.g, separate, {.threads = 1});
    CHECK(traffic.allocations > 2); // arena, workspace, one per parameter
  }
  CHECK(traffic.frees == traffic.allocations);
}

TEST_CASE("backend contract: memory a device cannot give is kiln.memory.host, naming the size") {
  const std::unique_ptr<kiln::Device> device = kiln::cpu_backend().open(1);
  const std::size_t too_much = std::size_t{1} << 60;
  const std::string message = kiln::test::error_message([&] { (void)device->allocate(too_much); });
  CHECK(message.rfind("[kiln.memory.host] cpu: cannot allocate", 0) == 0);
  CHECK(message.find(std::to_string(too_much)) != std::string::npos);
  std::byte* none = device->allocate(0);
  CHECK(none != nullptr);
  device->free(none);
}

TEST_CASE(
    "backend contract: a backend is chosen by name, and cuda without the CUDA build says so") {
  CHECK(&kiln::backend_named("cpu") == &kiln::cpu_backend());
  // This suite is built without kiln::cuda (tests/cuda has the CUDA backend's own tests).
  try {
    (void)kiln::backend_named("cuda");
    FAIL("a CUDA backend in a program built without it");
  } catch (const kiln::Error& e) {
    CHECK(e.code() == "kiln.cuda.unavailable");
    CHECK(e.message().find("-DKILN_CUDA=ON") != std::string::npos);
  }
  try {
    (void)kiln::backend_named("tpu");
    FAIL("a backend that does not exist");
  } catch (const kiln::Error& e) {
    CHECK(e.code() == "kiln.api.argument");
    CHECK(e.message() == "no backend named 'tpu' (backends: cpu)");
  }
}
