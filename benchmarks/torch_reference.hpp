// The reference vs_libtorch measures kiln against: the same networks trained with libtorch
// (PyTorch's C++ API), behind an interface free of torch headers so that only
// torch_reference.cpp pays for compiling them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
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

/// One network trained with libtorch on the caller's batches of 28x28 images, for comparing
/// accuracy: PyTorch's default initialisation drawn after torch::manual_seed(seed), SGD with
/// momentum, cross-entropy, as a libtorch user writes the loop.
class TorchClassifier {
public:
  TorchClassifier(const std::string& network, std::uint64_t seed, float lr, float momentum);
  ~TorchClassifier();
  TorchClassifier(TorchClassifier&&) noexcept;
  TorchClassifier& operator=(TorchClassifier&&) noexcept;

  /// One step in training mode on labels.size() images ([n, 1, 28, 28]); returns the loss.
  float train(std::span<const float> images, std::span<const std::int32_t> labels);
  void set_learning_rate(float lr);
  /// How many of the first `real` images evaluation mode classifies as labelled.
  std::int64_t correct(std::span<const float> images, std::span<const std::int32_t> labels,
                       std::int64_t real);

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Puts libtorch at its best before it loads, by re-executing the program (argv) once with
/// what is not yet set of: OPENBLAS_NUM_THREADS=1 (OpenBLAS's own thread pool fights
/// libtorch's OpenMP pool over the cores), and glibc's MALLOC_MMAP_THRESHOLD_ and
/// MALLOC_TRIM_THRESHOLD_ raised so that libtorch's per-step tensors are reused from the heap
/// instead of being mapped and page-faulted afresh every step. Returns when they are set.
void run_libtorch_at_its_best(char** argv);
/// The settings run_libtorch_at_its_best made, for a benchmark's header line.
std::string libtorch_settings();

/// torch::set_num_threads: the intra-op threads of every libtorch kernel.
void set_torch_threads(int threads);
/// Which libtorch this is, e.g. "libtorch 1.13.1".
std::string torch_version();

} // namespace bench
