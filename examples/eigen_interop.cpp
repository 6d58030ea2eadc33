// eigen_interop: a trainer whose data lives in Eigen. Batches are written straight into the
// compiled step's input memory through kiln::eigen::input, and the trained weights are read
// as Eigen matrices to evaluate the model with Eigen alone, which must agree with kiln.
#include <cstdio>

#include <Eigen/Core>

#include <kiln/eigen.hpp>
#include <kiln/kiln.hpp>

int main() try {
  constexpr int batch = 128, features = 6, classes = 3;
  // A linearly separable problem made with Eigen: class = argmax of a fixed projection.
  Eigen::MatrixXf truth = Eigen::MatrixXf::Random(features, classes);
  kiln::eigen::Matrix points = kiln::eigen::Matrix::Random(batch, features);
  std::vector<std::int32_t> labels(batch);
  for (int i = 0; i < batch; ++i) (points.row(i) * truth).maxCoeff(&labels[i]);

  kiln::nn::manual_seed(1);
  kiln::nn::Linear layer(features, classes);
  kiln::Graph g;
  kiln::Value x = g.input("x", {batch, features});
  kiln::Value y = g.input("y", {batch}, kiln::i32);
  kiln::Value logits = layer(x);
  g.mark_output(logits);
  kiln::Value loss = kiln::softmax_cross_entropy(logits, y);
  kiln::train_step(loss, layer.parameters(), kiln::optim::Adam{.lr = 0.05f});
  kiln::Executor step = kiln::compile(g, {.threads = 1});

  kiln::eigen::input(step, "x") = points; // into the plan's own input buffer: no set_input
  step.set_input("y", labels);
  for (int s = 1; s <= 300; ++s) {
    step.run();
    if (s % 100 == 0)
      std::printf("step %d  loss %.4f\n", s, static_cast<double>(step.scalar(loss)));
  }

  // One more run computes its logits from the current weights (before its own update); Eigen
  // computes them from the same weights.
  const std::vector<kiln::nn::Parameter> params = layer.parameters();
  const kiln::eigen::Matrix expected =
      (points * kiln::eigen::matrix(*params[0].tensor).transpose()).rowwise() +
      kiln::eigen::matrix(*params[1].tensor).row(0);
  step.run();
  const float difference = (kiln::eigen::output(step, logits) - expected).cwiseAbs().maxCoeff();
  int correct = 0;
  for (int i = 0; i < batch; ++i) {
    Eigen::Index predicted = 0;
    expected.row(i).maxCoeff(&predicted);
    correct += predicted == labels[static_cast<std::size_t>(i)];
  }
  std::printf("Eigen's logits from kiln's weights: max difference %.2e; accuracy %d/%d\n",
              static_cast<double>(difference), correct, batch);
  return difference < 1e-4f ? 0 : 1;
} catch (const kiln::Error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
