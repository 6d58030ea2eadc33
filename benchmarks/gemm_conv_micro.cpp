// GFLOP/s of the CPU matmul and convolution kernels on the MNIST CNN's and LeNet-5's shapes.
// Prints, per shape, the median and min..max GFLOP/s over --repeats timed runs (after one
// warm-up run) with FLOPs = 2 x multiply-adds of the op. `gemm_conv_micro --help` lists its
// flags.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <tbb/task_arena.h>

#include "kiln/backends/cpu/backend.hpp"
#include "kiln/backends/cpu/implementation.hpp"
#include "kiln/backends/cpu/workspace.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/rng.hpp"
#include "kiln_tools/command_line.hpp"

namespace {

struct alignas(64) Line {
  std::byte bytes[64];
};

struct Input {
  kiln::Shape shape;
  std::vector<float> data;
};

Input random_input(kiln::Shape shape, std::uint64_t seed) {
  kiln::Rng rng(seed);
  Input in{shape, std::vector<float>(static_cast<std::size_t>(shape.numel()))};
  for (float& v : in.data) v = rng.uniform(-1.0f, 1.0f);
  return in;
}

/// What to time: `repeats` runs of every shape whose name contains `only`; `timed` counts the
/// shapes timed so far.
struct Selection {
  int repeats = 21;
  std::string only;
  kiln::Precision precision = kiln::Precision::f32;
  int timed = 0;
};

/// Times op on random inputs and prints one table row, unless the selection leaves it out.
void bench(const char* name, kiln::Op op, std::vector<Input> inputs, kiln::Shape out_shape,
           const kiln::Attrs& attrs, double flops, Selection& selection) {
  if (std::string_view(name).find(selection.only) == std::string_view::npos) return;
  ++selection.timed;
  const int repeats = selection.repeats;
  std::vector<float> out(static_cast<std::size_t>(out_shape.numel()));
  kiln::KernelArgs args;
  for (Input& in : inputs) {
    args.in[static_cast<std::size_t>(args.num_inputs++)] =
        kiln::TensorView{in.data.data(), in.shape, kiln::DType::f32};
  }
  args.out = kiln::TensorView{out.data(), out_shape, kiln::DType::f32};
  args.attrs = &attrs;
  const kiln::KernelChoice choice =
      kiln::cpu::select(kiln::cpu::kernel_table(), op, args, selection.precision);
  args.workspace_per_worker = choice.workspace_per_worker;
  const auto threads = static_cast<std::size_t>(tbb::this_task_arena::max_concurrency());
  std::vector<Line> workspace(threads * args.workspace_per_worker / sizeof(Line) + 1);
  args.workspace = reinterpret_cast<std::byte*>(workspace.data());
  const kiln::KernelFn fn = choice.kernel;

  fn(args);
  std::vector<double> gflops;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(args);
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    gflops.push_back(flops / dt.count() * 1e-9);
  }
  std::sort(gflops.begin(), gflops.end());
  std::printf("%-46s %8.1f   %6.1f..%6.1f   %8.3f ms   ws %zu KiB/thread\n", name,
              gflops[gflops.size() / 2], gflops.front(), gflops.back(),
              flops / gflops[gflops.size() / 2] * 1e-6, args.workspace_per_worker / 1024);
}

/// A k x k stride-1 convolution, NCHW or, when `channels_last`, the layout pass's NHWC form
/// with its pre-packed weight.
struct ConvCase {
  std::int64_t c, hw, o, k = 3, pad = 0, batch = 64;
  bool channels_last = false;
  bool winograd = false;
};

void bench_conv(const char* name, kiln::Op op, const ConvCase& s, Selection& selection) {
  const std::int64_t n = s.batch, c = s.c, hw = s.hw, o = s.o, k = s.k;
  const std::int64_t ohw = hw + 2 * s.pad - k + 1;
  const bool channels_last = s.channels_last;
  const kiln::Shape x = channels_last ? kiln::Shape{n, hw, hw, c} : kiln::Shape{n, c, hw, hw};
  const kiln::Shape y = channels_last ? kiln::Shape{n, ohw, ohw, o} : kiln::Shape{n, o, ohw, ohw};
  kiln::Shape w{o, c, k, k};
  if (channels_last && op != kiln::Op::Conv2dGradWeight)
    w = op == kiln::Op::Conv2d ? kiln::Shape{k, k, c, o} : kiln::Shape{k, k, o, c};
  kiln::Conv2dAttrs conv;
  conv.channels_last = channels_last;
  conv.winograd = s.winograd;
  conv.pad_h = conv.pad_w = static_cast<int>(s.pad);
  const kiln::Attrs attrs = conv;
  const double flops = 2.0 * static_cast<double>(n * o * ohw * ohw * c * k * k);
  if (op == kiln::Op::Conv2d) {
    bench(name, op, {random_input(x, 1), random_input(w, 2)}, y, attrs, flops, selection);
  } else if (op == kiln::Op::Conv2dGradInput) {
    bench(name, op, {random_input(y, 1), random_input(w, 2)}, x, attrs, flops, selection);
  } else {
    bench(name, op, {random_input(x, 1), random_input(y, 2)}, w, attrs, flops, selection);
  }
}

void bench_matmul(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, bool ta,
                  bool tb, Selection& selection) {
  const kiln::Shape a = ta ? kiln::Shape{k, m} : kiln::Shape{m, k};
  const kiln::Shape b = tb ? kiln::Shape{n, k} : kiln::Shape{k, n};
  const kiln::Attrs attrs = kiln::MatMulAttrs{ta, tb};
  bench(name, kiln::Op::MatMul, {random_input(a, 1), random_input(b, 2)}, kiln::Shape{m, n}, attrs,
        2.0 * static_cast<double>(m * n * k), selection);
}

int run(int threads, Selection& selection) {
  kiln::check_precision(kiln::cpu_backend().target(), selection.precision);
  std::printf("target %s, %d thread(s), batch 64, %d repeats, products in %s\n",
              kiln::cpu::kernel_table().target_name, threads, selection.repeats,
              std::string(kiln::precision_name(selection.precision)).c_str());
  std::printf("%-46s %8s   %14s   %11s\n", "shape", "GFLOP/s", "min..max", "median");
  tbb::task_arena arena(threads);
  arena.execute([&] {
    using kiln::Op;
    const ConvCase first{.c = 1, .hw = 28, .o = 32}, second{.c = 32, .hw = 26, .o = 64};
    const ConvCase first_nhwc{.c = 1, .hw = 28, .o = 32, .channels_last = true};
    const ConvCase second_nhwc{.c = 32, .hw = 26, .o = 64, .channels_last = true};
    ConvCase second_winograd = second_nhwc;
    second_winograd.winograd = true;
    const ConvCase lenet_first{.c = 1, .hw = 28, .o = 6, .k = 5, .pad = 2};
    const ConvCase lenet_second{.c = 6, .hw = 14, .o = 16, .k = 5};
    bench_conv("conv 1->32 3x3 28x28", Op::Conv2d, first, selection);
    bench_conv("conv 1->32 dW", Op::Conv2dGradWeight, first, selection);
    bench_conv("conv 32->64 3x3 26x26", Op::Conv2d, second, selection);
    bench_conv("conv 32->64 dX", Op::Conv2dGradInput, second, selection);
    bench_conv("conv 32->64 dW", Op::Conv2dGradWeight, second, selection);
    bench_conv("conv 1->32 3x3 28x28, NHWC", Op::Conv2d, first_nhwc, selection);
    bench_conv("conv 1->32 dW, NHWC", Op::Conv2dGradWeight, first_nhwc, selection);
    bench_conv("conv 32->64 3x3 26x26, NHWC", Op::Conv2d, second_nhwc, selection);
    bench_conv("conv 32->64 dX, NHWC", Op::Conv2dGradInput, second_nhwc, selection);
    bench_conv("conv 32->64 dW, NHWC", Op::Conv2dGradWeight, second_nhwc, selection);
    bench_conv("conv 32->64 3x3 26x26, Winograd", Op::Conv2d, second_winograd, selection);
    bench_conv("conv 32->64 dX, Winograd", Op::Conv2dGradInput, second_winograd, selection);
    bench_conv("conv 32->64 dW, Winograd", Op::Conv2dGradWeight, second_winograd, selection);
    for (const std::int64_t channels : {16, 32}) {
      const std::int64_t hw = channels == 16 ? 28 : 14;
      ConvCase block{.c = channels, .hw = hw, .o = channels, .pad = 1, .channels_last = true};
      const std::string name = "resnet conv " + std::to_string(channels) + "->" +
                               std::to_string(channels) + " " + std::to_string(hw) + "x" +
                               std::to_string(hw) + " pad 1";
      for (const bool winograd : {false, true}) {
        block.winograd = winograd;
        const std::string form = winograd ? ", Winograd" : ", NHWC";
        bench_conv((name + form).c_str(), Op::Conv2d, block, selection);
        bench_conv((name + " dX" + form).c_str(), Op::Conv2dGradInput, block, selection);
        bench_conv((name + " dW" + form).c_str(), Op::Conv2dGradWeight, block, selection);
      }
    }
    bench_conv("lenet conv 1->6 5x5 pad 2", Op::Conv2d, lenet_first, selection);
    bench_conv("lenet conv 1->6 dW", Op::Conv2dGradWeight, lenet_first, selection);
    bench_conv("lenet conv 6->16 5x5 14x14", Op::Conv2d, lenet_second, selection);
    bench_conv("lenet conv 6->16 dX", Op::Conv2dGradInput, lenet_second, selection);
    bench_conv("lenet conv 6->16 dX, NHWC (scatter)", Op::Conv2dGradInput,
               {.c = 6, .hw = 14, .o = 16, .k = 5, .channels_last = true}, selection);
    bench_conv("lenet conv 6->16 dW", Op::Conv2dGradWeight, lenet_second, selection);
    // The forms the layout pass gives LeNet-5's second convolution in the training step.
    const ConvCase lenet_second_nhwc{.c = 6, .hw = 14, .o = 16, .k = 5, .channels_last = true};
    bench_conv("lenet conv 6->16 5x5 14x14, NHWC", Op::Conv2d, lenet_second_nhwc, selection);
    bench_conv("lenet conv 6->16 dW, NHWC", Op::Conv2dGradWeight, lenet_second_nhwc, selection);
    bench_matmul("matmul [64,9216]x[128,9216]^T", 64, 128, 9216, false, true, selection);
    bench_matmul("matmul [128,64]^T x [64,9216] (dW)", 128, 9216, 64, true, false, selection);
    bench_matmul("matmul [64,128]x[128,9216] (dX)", 64, 9216, 128, false, false, selection);
    bench_matmul("matmul [64,128]x[10,128]^T", 64, 10, 128, false, true, selection);
    bench_matmul("lenet matmul [64,120]^T x [64,400] (dW)", 120, 400, 64, true, false, selection);
  });
  if (selection.timed == 0)
    kiln::fail(kiln::errc::argument, "--only: no shape's name contains '" + selection.only + "'");
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app("Times the CPU convolution and matmul kernels alone on the reference networks' "
               "shapes.",
               "gemm_conv_micro");
  kiln::tools::share_conventions(app);
  int threads = 1;
  Selection selection;
  app.add_option("-t,--threads", threads, "worker threads")
      ->check(kiln::tools::integer_in(1, 1024));
  app.add_option("-r,--repeats", selection.repeats, "timed runs per shape")
      ->check(kiln::tools::integer_in(1, 100000));
  app.add_option("--only", selection.only,
                 "time only the shapes whose name contains this text, e.g. 'dX, NHWC'");
  std::string precision = "f32";
  app.add_option("--precision", precision,
                 "what the kernels multiply in: f32, or bf16 (the variants that have it)")
      ->check(kiln::tools::one_of({"f32", "bf16"}, "precision"));
  return kiln::tools::run(app, argc, argv, [&] {
    selection.precision = precision == "bf16" ? kiln::Precision::bf16 : kiln::Precision::f32;
    return run(threads, selection);
  });
}
