// The reference vs_libtorch measures kiln against: the same networks trained with libtorch
// (PyTorch's C++ API), behind an interface free of torch headers so that only
// torch_reference.cpp pays for compiling them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bench {

/// One network trained with libtorch: SGD with momentum over one fixed batch, as kiln's
/// training step does. Networks: "mnist_cnn", "lenet5", "small_resnet" (kiln::nn::models).
class TorchTrainer {
public:
  TorchTrainer(const std::string& network, int batch, const std::vector<float>& images,
               const std::vector<std::int32_t>& labels, float lr, float momentum);
  ~TorchTrainer();
  TorchTrainer(TorchTrainer&&) noexcept;
  TorchTrainer& operator=(TorchTrainer&&) noexcept;

  /// Forward, backward and the optimizer update.
  void step();
  /// The loss of the last step.
  [[nodiscard]] float loss() const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// torch::set_num_threads: the intra-op threads of every libtorch kernel.
void set_torch_threads(int threads);
/// Which libtorch this is, e.g. "libtorch 1.13.1".
std::string torch_version();

} // namespace bench
