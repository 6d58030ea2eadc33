// libtorch versions of kiln::nn::models, trained the way a libtorch user would write it.
#include "torch_reference.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include <torch/torch.h>

namespace bench {

namespace {

namespace tnn = torch::nn;

tnn::Conv2d conv(int in, int out, int kernel, int stride = 1, int padding = 0, bool bias = true) {
  return tnn::Conv2d(
      tnn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(bias));
}

/// conv-bn-relu-conv-bn plus the skip, as kiln::nn::Residual around that Sequential.
struct ResidualBlockImpl : tnn::Module {
  explicit ResidualBlockImpl(int c)
      : body(register_module(
            "body", tnn::Sequential(conv(c, c, 3, 1, 1, false), tnn::BatchNorm2d(c), tnn::ReLU(),
                                    conv(c, c, 3, 1, 1, false), tnn::BatchNorm2d(c)))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + body->forward(x); }
  tnn::Sequential body;
};
TORCH_MODULE(ResidualBlock);

tnn::Sequential make(const std::string& network) {
  if (network == "mnist_cnn")
    return tnn::Sequential(conv(1, 32, 3), tnn::ReLU(), conv(32, 64, 3), tnn::ReLU(),
                           tnn::MaxPool2d(2), tnn::Flatten(), tnn::Linear(9216, 128), tnn::ReLU(),
                           tnn::Linear(128, 10));
  if (network == "lenet5")
    return tnn::Sequential(conv(1, 6, 5, 1, 2), tnn::ReLU(), tnn::AvgPool2d(2), conv(6, 16, 5),
                           tnn::ReLU(), tnn::AvgPool2d(2), tnn::Flatten(), tnn::Linear(400, 120),
                           tnn::ReLU(), tnn::Linear(120, 84), tnn::ReLU(), tnn::Linear(84, 10));
  if (network == "small_resnet")
    return tnn::Sequential(conv(1, 16, 3, 1, 1, false), tnn::BatchNorm2d(16), tnn::ReLU(),
                           ResidualBlock(16), tnn::ReLU(), conv(16, 32, 3, 2, 1, false),
                           tnn::BatchNorm2d(32), tnn::ReLU(), ResidualBlock(32), tnn::ReLU(),
                           tnn::AdaptiveAvgPool2d(1), tnn::Flatten(), tnn::Linear(32, 10));
  throw std::invalid_argument("no libtorch version of network '" + network + "'");
}

} // namespace

struct TorchTrainer::Impl {
  tnn::Sequential net;
  torch::optim::SGD optimizer;
  torch::Tensor images, labels, last_loss;
  Impl(const std::string& network, int batch, const std::vector<float>& x,
       const std::vector<std::int32_t>& y, float lr, float momentum)
      : net(make(network)),
        optimizer(net->parameters(), torch::optim::SGDOptions(lr).momentum(momentum)) {
    images = torch::from_blob(const_cast<float*>(x.data()), {batch, 1, 28, 28}).clone();
    labels = torch::from_blob(const_cast<std::int32_t*>(y.data()), {batch}, torch::kInt32)
                 .to(torch::kLong);
    net->train();
  }
};

TorchTrainer::TorchTrainer(const std::string& network, int batch, const std::vector<float>& images,
                           const std::vector<std::int32_t>& labels, float lr, float momentum)
    : impl_(std::make_unique<Impl>(network, batch, images, labels, lr, momentum)) {}
TorchTrainer::~TorchTrainer() = default;
TorchTrainer::TorchTrainer(TorchTrainer&&) noexcept = default;
TorchTrainer& TorchTrainer::operator=(TorchTrainer&&) noexcept = default;

void TorchTrainer::step() {
  impl_->optimizer.zero_grad();
  impl_->last_loss =
      torch::nn::functional::cross_entropy(impl_->net->forward(impl_->images), impl_->labels);
  impl_->last_loss.backward();
  impl_->optimizer.step();
}

float TorchTrainer::loss() const { return impl_->last_loss.item<float>(); }

struct TorchClassifier::Impl {
  tnn::Sequential net;
  torch::optim::SGD optimizer;
  Impl(const std::string& network, float lr, float momentum)
      : net(make(network)),
        optimizer(net->parameters(), torch::optim::SGDOptions(lr).momentum(momentum)) {}

  static torch::Tensor images_of(std::span<const float> images, std::int64_t n) {
    return torch::from_blob(const_cast<float*>(images.data()), {n, 1, 28, 28});
  }
  static torch::Tensor labels_of(std::span<const std::int32_t> labels) {
    return torch::from_blob(const_cast<std::int32_t*>(labels.data()),
                            {static_cast<std::int64_t>(labels.size())}, torch::kInt32)
        .to(torch::kLong);
  }
};

TorchClassifier::TorchClassifier(const std::string& network, std::uint64_t seed, float lr,
                                 float momentum) {
  torch::manual_seed(seed); // before the network draws its initial weights
  impl_ = std::make_unique<Impl>(network, lr, momentum);
}
TorchClassifier::~TorchClassifier() = default;
TorchClassifier::TorchClassifier(TorchClassifier&&) noexcept = default;
TorchClassifier& TorchClassifier::operator=(TorchClassifier&&) noexcept = default;

float TorchClassifier::train(std::span<const float> images, std::span<const std::int32_t> labels) {
  const auto n = static_cast<std::int64_t>(labels.size());
  impl_->net->train();
  impl_->optimizer.zero_grad();
  torch::Tensor loss = torch::nn::functional::cross_entropy(
      impl_->net->forward(Impl::images_of(images, n)), Impl::labels_of(labels));
  loss.backward();
  impl_->optimizer.step();
  return loss.item<float>();
}

void TorchClassifier::set_learning_rate(float lr) {
  for (auto& group : impl_->optimizer.param_groups())
    static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
}

std::int64_t TorchClassifier::correct(std::span<const float> images,
                                      std::span<const std::int32_t> labels, std::int64_t real) {
  const auto n = static_cast<std::int64_t>(labels.size());
  torch::NoGradGuard no_grad;
  impl_->net->eval();
  const torch::Tensor predicted = impl_->net->forward(Impl::images_of(images, n)).argmax(1);
  return predicted.slice(0, 0, real)
      .eq(Impl::labels_of(labels).slice(0, 0, real))
      .sum()
      .item<std::int64_t>();
}

namespace {
constexpr const char* best_settings[][2] = {{"OPENBLAS_NUM_THREADS", "1"},
                                            {"MALLOC_MMAP_THRESHOLD_", "67108864"},
                                            {"MALLOC_TRIM_THRESHOLD_", "134217728"}};
} // namespace

void run_libtorch_at_its_best(char** argv) {
  bool missing = false;
  for (const auto& [name, value] : best_settings)
    if (std::getenv(name) == nullptr) {
      setenv(name, value, 1);
      missing = true;
    }
  if (!missing) return;
  execv("/proc/self/exe", argv);
  std::perror("cannot re-execute with libtorch's settings");
  std::exit(1);
}

std::string libtorch_settings() {
  std::string text;
  for (const auto& [name, value] : best_settings)
    text += (text.empty() ? "" : " ") + std::string(name) + "=" +
            (std::getenv(name) ? std::getenv(name) : "(unset)");
  return text;
}

void set_torch_threads(int threads) { torch::set_num_threads(threads); }

std::string torch_version() {
  return "libtorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
         std::to_string(TORCH_VERSION_MINOR) + "." + std::to_string(TORCH_VERSION_PATCH);
}

} // namespace bench
