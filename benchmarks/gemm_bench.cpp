// gemm_bench: kiln's matmul kernel (no -march flags; Highway picks the target at run time)
// against Eigen built with -march=native, one thread, on square sizes and the MNIST CNN's
// own shapes, with each result as a share of the FMA peak measured at start (in the run's
// context). Google Benchmark; `--benchmark_format=json` writes machine-readable results.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include <tbb/task_arena.h>

#include "kiln/backends/cpu/backend.hpp"
#include "kiln/backends/cpu/workspace.hpp"
#include "kiln/core/rng.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln_tools/command_line.hpp"

void eigen_gemm(const float* a, const float* b, float* c, long m, long n, long k, bool transpose_b);

namespace {

struct Operands {
  std::vector<float> a, b, c;
  Operands(long m, long n, long k)
      : a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)),
        c(static_cast<std::size_t>(m * n)) {
    kiln::Rng rng(1);
    for (float& v : a) v = rng.uniform(-1.0f, 1.0f);
    for (float& v : b) v = rng.uniform(-1.0f, 1.0f);
  }
};

/// One core's FP32 multiply-add peak, measured before the benchmarks run.
double peak_flops = 0.0;

void set_flops(benchmark::State& state, long m, long n, long k) {
  const double flops = 2.0 * static_cast<double>(m * n * k);
  state.counters["FLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["of_peak"] =
      benchmark::Counter(flops / peak_flops, benchmark::Counter::kIsIterationInvariantRate);
}

void kiln_matmul(benchmark::State& state) {
  const long m = state.range(0), n = state.range(1), k = state.range(2);
  const bool transpose_b = state.range(3) != 0;
  Operands x(m, n, k);
  const kiln::Attrs attrs = kiln::MatMulAttrs{false, transpose_b};
  kiln::KernelArgs args;
  args.num_inputs = 2;
  args.in[0] = {x.a.data(), kiln::Shape{m, k}, kiln::f32};
  args.in[1] = {x.b.data(), transpose_b ? kiln::Shape{n, k} : kiln::Shape{k, n}, kiln::f32};
  args.out = {x.c.data(), kiln::Shape{m, n}, kiln::f32};
  args.attrs = &attrs;
  const kiln::KernelChoice choice =
      kiln::cpu::select(kiln::cpu::kernel_table(), kiln::Op::MatMul, args);
  args.workspace_per_worker = choice.workspace_per_worker;
  auto workspace = kiln::detail::aligned_zeroed(args.workspace_per_worker);
  args.workspace = workspace.get();
  const kiln::KernelFn fn = choice.kernel;
  tbb::task_arena one_thread(1);
  one_thread.execute([&] {
    for (auto _ : state) {
      fn(args);
      benchmark::DoNotOptimize(x.c.data());
    }
  });
  set_flops(state, m, n, k);
  state.SetLabel(kiln::cpu::kernel_table().target_name);
}

void eigen_matmul(benchmark::State& state) {
  const long m = state.range(0), n = state.range(1), k = state.range(2);
  Operands x(m, n, k);
  for (auto _ : state) {
    eigen_gemm(x.a.data(), x.b.data(), x.c.data(), m, n, k, state.range(3) != 0);
    benchmark::DoNotOptimize(x.c.data());
  }
  set_flops(state, m, n, k);
}

// {M, N, K, transpose_b}: squares, the first linear layer forward (x·Wᵀ), and one image of
// the second convolution as a GEMM (64 filters x 288 taps x 576 positions).
void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "tB"});
  for (long s : {128L, 256L, 512L}) b->Args({s, s, s, 0});
  b->Args({64, 128, 9216, 1});
  b->Args({64, 576, 288, 0});
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK(kiln_matmul)->Apply(shapes);
BENCHMARK(eigen_matmul)->Apply(shapes);

} // namespace

int main(int argc, char** argv) {
  CLI::App app("Times kiln's matmul kernel against Eigen on one thread (Google Benchmark).",
               "gemm_bench");
  kiln::tools::share_conventions(app);
  app.allow_extras();
  app.footer("Google Benchmark's own flags pass through, e.g. --benchmark_filter=REGEX,\n"
             "--benchmark_format=json, --benchmark_out=FILE, --benchmark_repetitions=N.");
  return kiln::tools::run(app, argc, argv, [&] {
    std::vector<std::string> benchmark_args{argv[0]};
    for (const std::string& a : app.remaining()) benchmark_args.push_back(a);
    std::vector<char*> pointers;
    for (std::string& a : benchmark_args) pointers.push_back(a.data());
    int count = static_cast<int>(pointers.size());
    benchmark::Initialize(&count, pointers.data());
    if (benchmark::ReportUnrecognizedArguments(count, pointers.data()))
      return kiln::tools::exit_usage;
    peak_flops = 1e9 * kiln::cpu::kernel_table().fma_gflops(0.5);
    // In the run's context, so that the console header and the JSON output both carry it.
    benchmark::AddCustomContext("fma_peak_gflops_one_core", std::to_string(peak_flops * 1e-9));
    benchmark::AddCustomContext("kiln_target", kiln::cpu::kernel_table().target_name);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
  });
}
