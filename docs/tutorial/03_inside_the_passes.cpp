// Tutorial step 3: what the compiler did to a training step: the IR after each pass, every
// pass's statistics, and every fusion decision with its reason.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>

#include <kiln/kiln.hpp>

int main() try {
  kiln::nn::manual_seed(1);
  kiln::nn::Sequential net{kiln::nn::Linear(8, 16), kiln::nn::ReLU(), kiln::nn::Linear(16, 2)};
  kiln::Graph g;
  kiln::Value x = g.input("x", {4, 8});
  kiln::Value y = g.input("y", {4}, kiln::i32);
  kiln::train_step(kiln::softmax_cross_entropy(net(x), y), net.parameters(),
                   kiln::optim::SGD{.lr = 0.1f, .momentum = 0.9f});

  // dump_ir receives the graph's text after every pass (here kept, and its size printed).
  std::ostringstream ir;
  kiln::Executor exe = kiln::compile(g, {.threads = 1, .dump_ir = &ir});
  const std::string dumped = ir.str();
  std::printf("the graph as built: %d nodes; IR dumped after the passes: %zu lines\n", g.size(),
              static_cast<std::size_t>(std::count(dumped.begin(), dumped.end(), '\n')));

  std::printf("\n%-18s %4s %7s %7s  statistics\n", "pass", "ran", "before", "after");
  for (const kiln::PassRecord& p : exe.report().passes) {
    std::printf("%-18s %4s %7d %7d ", p.name.c_str(), p.ran ? "yes" : "no", p.nodes_before,
                p.nodes_after);
    for (const auto& [name, value] : p.stats)
      std::printf(" %s=%lld", name.c_str(), static_cast<long long>(value));
    std::printf("\n");
  }

  std::printf("\nfusion decisions:\n");
  for (const kiln::FusionDecision& d : exe.report().fusion)
    std::printf("  %-16s %s -> %s: %s\n", d.pass.c_str(), d.producer_op.c_str(),
                d.consumer_op.c_str(), std::string(kiln::fusion_reason_name(d.reason)).c_str());

  std::printf("\nthe optimised step (%zu kernels):\n%s", exe.plan().steps.size(),
              kiln::to_text(*exe.report().optimised).c_str());
  return 0;
} catch (const kiln::Error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
