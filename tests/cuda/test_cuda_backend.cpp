// The CUDA backend against the CPU: every op harness row, finite-difference gradients on the
// device, the three reference networks' training steps, CUDA-graph replay against plain
// launches, and its errors. Without a GPU every case that needs one reports a skip.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kiln/cuda.hpp"
#include "ops/op_harness.hpp"
#include "ops/op_rows.hpp"
#include "support/graph_test_helpers.hpp"
#include "support/skip.hpp"

namespace {

using kiln::test::OpRow;

/// The CUDA backend, or null after reporting the case skipped because no GPU is visible.
const kiln::Backend* gpu() {
  try {
    return &kiln::cuda_backend();
  } catch (const kiln::Error& e) {
    kiln::test::skip("no CUDA device: " + e.message());
    return nullptr;
  }
}

/// One reference network's training step at batch 8, parameters seeded the same every time.
struct Network {
  kiln::Graph g;
  kiln::nn::Sequential net;
  kiln::TrainStep step;
  Network(const std::function<kiln::nn::Sequential()>& make, std::int64_t batch)
      : net(seeded(make)), step(build(g, net, batch)) {}
  static kiln::nn::Sequential seeded(const std::function<kiln::nn::Sequential()>& make) {
    kiln::nn::manual_seed(11);
    return make();
  }
  static kiln::TrainStep build(kiln::Graph& g, kiln::nn::Sequential& net, std::int64_t batch) {
    const auto x = g.input("x", {batch, 1, 28, 28});
    const auto y = g.input("y", {batch}, kiln::i32);
    return kiln::train_step(kiln::softmax_cross_entropy(net(x), y), net.parameters(),
                            kiln::optim::SGD{.lr = 0.01f, .momentum = 0.9f});
  }
};

const std::vector<std::pair<std::string, std::function<kiln::nn::Sequential()>>> networks = {
    {"mnist_cnn", &kiln::nn::models::mnist_cnn},
    {"lenet5", &kiln::nn::models::lenet5},
    {"small_resnet", &kiln::nn::models::small_resnet}};

/// The losses of `steps` runs of a network's step on `backend`, on the same seeded batches.
std::vector<float> losses(const std::function<kiln::nn::Sequential()>& make,
                          const kiln::Backend& backend, int steps,
                          const kiln::CompileOptions& options = {}) {
  const std::int64_t batch = 8;
  Network n(make, batch);
  kiln::Executor exe = kiln::compile(n.g, backend, options);
  std::vector<float> out;
  for (int s = 0; s < steps; ++s) {
    exe.set_input("x", kiln::test::random_inputs(batch * 28 * 28, 100 + static_cast<unsigned>(s)));
    std::vector<std::int32_t> y(static_cast<std::size_t>(batch));
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>((i * 7 + s) % 10);
    exe.set_input("y", y);
    exe.run();
    out.push_back(exe.scalar(n.step.loss));
  }
  return out;
}

double relative(float a, float b) {
  return std::abs(static_cast<double>(a) - b) / std::max(1e-6, std::abs(static_cast<double>(b)));
}

} // namespace

TEST_CASE("cuda: every op harness row's kernel matches the CPU's scalar reference") {
  const kiln::Backend* cuda = gpu();
  if (!cuda) return;
  int rows = 0;
  for (const OpRow& row : kiln::test::op_rows()) {
    INFO(kiln::test::row_name(row));
    const auto values = kiln::test::draw_all(row, 1);
    const auto want = kiln::test::expected(row, values, kiln::test::row_output(row));
    const kiln::test::RowRun run = kiln::test::run_row(*cuda, row, values, 1);
    INFO("kernel " << run.kernel_name);
    CHECK(kiln::test::relative_error(run.out, want) <= row.tolerance);
    ++rows;
  }
  CHECK(rows > 100);
}

TEST_CASE("cuda: a kernel over a dying input computes the same as over memory of its own") {
  const kiln::Backend* cuda = gpu();
  if (!cuda) return;
  int in_place = 0;
  for (const OpRow& row : kiln::test::op_rows()) {
    const kiln::TensorType out = kiln::test::row_output(row);
    const int operand = kiln::test::overwritable_operand(row, out);
    if (operand < 0) continue;
    INFO(kiln::test::row_name(row) << ", operand " << operand << " dying at it");
    const auto values = kiln::test::draw_all(row, 3);
    const auto want = kiln::test::expected(row, values, out);
    const kiln::test::RowRun run = kiln::test::run_row(*cuda, row, values, 1, operand);
    CHECK(run.in_place_of == operand);
    CHECK(kiln::test::relative_error(run.out, want) <= row.tolerance);
    in_place += run.in_place_of == operand;
  }
  CHECK(in_place > 50);
}

TEST_CASE("cuda: gradients computed on the device match central finite differences") {
  const kiln::Backend* cuda = gpu();
  if (!cuda) return;
  for (const OpRow& row : kiln::test::op_rows()) {
    if (!row.gradient) continue;
    INFO(kiln::test::row_name(row));
    const kiln::GradCheckResult r = kiln::test::check_row_gradient(row, 7, *cuda);
    INFO(r.worst);
    CHECK(r.ok);
  }
}

TEST_CASE("cuda: the reference networks train as on the CPU, first step and four steps") {
  const kiln::Backend* cuda = gpu();
  if (!cuda) return;
  for (const auto& [name, make] : networks) {
    INFO(name);
    const std::vector<float> cpu = losses(make, kiln::cpu_backend(), 4, {.threads = 2});
    const std::vector<float> gpu_losses = losses(make, *cuda, 4);
    CHECK(relative(gpu_losses[0], cpu[0]) <= 1e-4);
    for (std::size_t s = 0; s < cpu.size(); ++s) {
      INFO("step " << s << ": cuda " << gpu_losses[s] << ", cpu " << cpu[s]);
      CHECK(relative(gpu_losses[s], cpu[s]) <= 1e-3);
    }
  }
}

TEST_CASE("cuda: every pass off computes the same losses as every pass on") {
  const kiln::Backend* cuda = gpu();
  if (!cuda) return;
  for (const auto& [name, make] : networks) {
    INFO(name);
    const std::vector<float> on = losses(make, *cuda, 3);
    const std::vector<float> off = losses(make, *cuda, 3, {.disable = kiln::optimisation_names()});
    for (std::size_t s = 0; s < on.size(); ++s) {
      INFO("step " << s << ": passes on " << on[s] << ", off " << off[s]);
      CHECK(relative(on[s], off[s]) <= 1e-4);
    }
  }
}

TEST_CASE("cuda: a step replayed as a CUDA graph equals plain launches bit for bit") {
  const kiln::Backend* cuda = gpu();
  if (!cuda) return;
  for (const auto& [name, make] : networks) {
    INFO(name);
    Network replayed(make, 8), launched(make, 8);
    kiln::Executor a = kiln::compile(replayed.g, *cuda);
    kiln::Executor b = kiln::compile(launched.g, *cuda, {.replay = false});
    for (int s = 0; s < 5; ++s) {
      const std::vector<float> x = kiln::test::random_inputs(8 * 28 * 28, 7 + s);
      const std::vector<std::int32_t> y = {1, 2, 3, 4, 5, 6, 7, 8};
      for (kiln::Executor* exe : {&a, &b}) {
        exe->set_input("x", x);
        exe->set_input("y", y);
        exe->run();
      }
      CHECK(a.scalar(replayed.step.loss) == b.scalar(launched.step.loss));
    }
    const auto* device = dynamic_cast<const kiln::cuda::CudaDevice*>(&a.device());
    REQUIRE(device != nullptr);
    CHECK(device->replaying());
    CHECK_FALSE(dynamic_cast<const kiln::cuda::CudaDevice*>(&b.device())->replaying());
    a.download_params();
    b.download_params();
    for (std::size_t p = 0; p < replayed.net.parameters().size(); ++p) {
      const auto& pa = replayed.net.parameters()[p].tensor->f32();
      const auto& pb = launched.net.parameters()[p].tensor->f32();
      CHECK(std::equal(pa.begin(), pa.end(), pb.begin()));
    }
  }
}

TEST_CASE("cuda: dropout masks are the CPU's, and change every run, replayed or not") {
  const kiln::Backend* cuda = gpu();
  if (!cuda) return;
  kiln::Graph g;
  const kiln::Value mask = kiln::dropout_mask(g, {4, 1000}, 0.3f, 42);
  g.mark_output(mask);
  kiln::Executor cpu = kiln::compile(g, kiln::cpu_backend(), {.threads = 1});
  kiln::Executor device = kiln::compile(g, *cuda);
  std::vector<float> previous;
  for (int run = 0; run < 4; ++run) {
    cpu.run();
    device.run();
    const auto a = cpu.output(mask);
    const auto b = device.output(mask);
    CHECK(std::equal(a.begin(), a.end(), b.begin()));
    CHECK(std::vector<float>(b.begin(), b.end()) != previous);
    previous.assign(b.begin(), b.end());
  }
}

TEST_CASE(
    "cuda: memory the device does not have is kiln.memory.cuda, naming bytes asked and free") {
  const kiln::Backend* cuda = gpu();
  if (!cuda) return;
  const std::unique_ptr<kiln::Device> device = cuda->open(1);
  const std::size_t petabyte = std::size_t{1} << 50;
  try {
    (void)device->allocate(petabyte);
    FAIL("a petabyte was allocated");
  } catch (const kiln::Error& e) {
    CHECK(e.code() == "kiln.memory.cuda");
    CHECK(e.message().find(std::to_string(petabyte) + " bytes") != std::string::npos);
    CHECK(e.message().find("bytes are free") != std::string::npos);
    CHECK(e.message().find("device 0") != std::string::npos);
  }
  // The device is still usable afterwards.
  std::byte* small = device->allocate(1024);
  const std::vector<float> in(256, 2.5f);
  std::vector<float> out(256, 0.0f);
  device->copy_in(small, in.data(), 1024);
  device->copy_out(out.data(), small, 1024);
  CHECK(out == in);
  device->free(small);
}

TEST_CASE("cuda: the device's peak and bandwidth are measured, and profiles time every step") {
  const kiln::Backend* cuda = gpu();
  if (!cuda) return;
  Network n(&kiln::nn::models::lenet5, 8);
  kiln::Executor exe = kiln::compile(n.g, *cuda, {.profile = true});
  const kiln::MachinePeak peak = kiln::machine_peak(exe.plan());
  CHECK(peak.gflops > 1000.0);
  CHECK(peak.gbytes_per_s > 100.0);
  for (int s = 0; s < 3; ++s) exe.run();
  double total = 0.0;
  for (const kiln::StepTime& t : exe.step_times()) {
    CHECK(t.seconds > 0.0);
    total += t.seconds;
  }
  CHECK(total > 0.0);
}

TEST_CASE("cuda: a CUDA error maps to the kiln.cuda code a program can act on") {
  CHECK(kiln::cuda::error_code(cudaErrorNoDevice) == "kiln.cuda.no_device");
  CHECK(kiln::cuda::error_code(cudaErrorInsufficientDriver) == "kiln.cuda.driver");
  CHECK(kiln::cuda::error_code(cudaErrorMemoryAllocation) == "kiln.memory.cuda");
  CHECK(kiln::cuda::error_code(cudaErrorIllegalAddress) == "kiln.cuda.launch");
  CHECK(kiln::cuda::error_code(cudaErrorInvalidValue) == "kiln.cuda.call");
  try {
    kiln::cuda::check(cudaErrorInvalidValue, "cudaMemcpy", "device 0");
    FAIL("check passed an error");
  } catch (const kiln::Error& e) {
    CHECK(e.code() == "kiln.cuda.call");
    CHECK(e.message() == "cuda: cudaMemcpy failed on device 0: cudaErrorInvalidValue (invalid "
                         "argument)");
  }
}

TEST_CASE("no device: with no GPU visible, asking for the CUDA backend is kiln.cuda.no_device") {
  // Its ctest entry (cuda.no_device_visible) runs it with CUDA_VISIBLE_DEVICES empty, GPU or not.
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!visible || *visible) {
    kiln::test::skip("needs CUDA_VISIBLE_DEVICES set and empty (as its ctest entry sets it)");
    return;
  }
  try {
    (void)kiln::backend_named("cuda");
    FAIL("a backend was made without a device");
  } catch (const kiln::Error& e) {
    CHECK(e.code() == "kiln.cuda.no_device");
    CHECK(e.message().find("no CUDA device is visible") != std::string::npos);
  }
}
