// Tutorial step 1: build a graph by hand, print it, compile it and run it.
#include <cstdio>
#include <memory>
#include <vector>

#include <kiln/kiln.hpp>

int main() try {
  // A graph holds inputs (fed at every run), parameters (tensors it reads and may update) and
  // the ops between them. Building an op checks its operands' shapes at once.
  kiln::Graph g;
  kiln::Value x = g.input("x", {2, 3});
  auto bias = std::make_shared<kiln::Tensor>(kiln::Shape{3});
  const float bias_values[] = {0.5f, -1.0f, 2.0f};
  std::copy(std::begin(bias_values), std::end(bias_values), bias->f32().begin());
  kiln::Value b = g.param("bias", bias);
  kiln::Value y = kiln::mul_scalar(kiln::relu(x + b), 2.0f); // [2,3] + [3] broadcasts
  g.mark_output(y);

  // The text form is what every pass reads and writes.
  std::printf("%s", kiln::to_text(g).c_str());

  // compile() optimises a copy of the graph (the relu chain becomes one fused kernel),
  // plans its memory and prepares the kernels; the Executor runs it.
  kiln::Executor exe = kiln::compile(g, {.threads = 1});
  const std::vector<float> input = {1, 2, 3, -4, 0.5f, -3};
  exe.set_input("x", input);
  exe.run();
  std::printf("kernels: %zu\ny =", exe.plan().steps.size());
  for (float v : exe.output(y)) std::printf(" %g", v);
  std::printf("\n");
  return 0;
} catch (const kiln::Error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
