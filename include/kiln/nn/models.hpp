// Reference networks shared by examples, tests and benchmarks: the classic MNIST CNN, a
// LeNet-5-style net, and a small residual net, all for 1x28x28 inputs and 10 classes.
#pragma once

#include "kiln/nn/batch_norm2d.hpp"
#include "kiln/nn/conv2d.hpp"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/residual.hpp"
#include "kiln/nn/sequential.hpp"
#include "kiln/nn/simple_layers.hpp"

namespace kiln::nn::models {

/// conv 1->32 3x3, relu, conv 32->64 3x3, relu, maxpool 2, flatten, linear 9216->128, relu,
/// linear 128->10 (PyTorch's MNIST example without dropout).
inline Sequential mnist_cnn() {
  return Sequential{Conv2d(1, 32, 3),  ReLU(), Conv2d(32, 64, 3), ReLU(), MaxPool2d(2), Flatten(),
                    Linear(9216, 128), ReLU(), Linear(128, 10)};
}

/// LeNet-5 with ReLU and average pooling: conv 1->6 5x5 pad 2, avgpool 2, conv 6->16 5x5,
/// avgpool 2, linear 400->120->84->10.
inline Sequential lenet5() {
  return Sequential{Conv2d(1, 6, 5, 1, 2),
                    ReLU(),
                    AvgPool2d(2),
                    Conv2d(6, 16, 5),
                    ReLU(),
                    AvgPool2d(2),
                    Flatten(),
                    Linear(400, 120),
                    ReLU(),
                    Linear(120, 84),
                    ReLU(),
                    Linear(84, 10)};
}

/// A small ResNet: a 3x3 stem to 16 channels with batchnorm, two residual blocks (conv-bn-relu-
/// conv-bn plus the skip, then relu), the second at 14x14 after a stride-2 conv, global
/// average pooling and a linear classifier.
inline Sequential small_resnet() {
  const auto block = [](std::int64_t c) {
    return Residual(Sequential{Conv2d(c, c, 3, 1, 1, false), BatchNorm2d(c), ReLU(),
                               Conv2d(c, c, 3, 1, 1, false), BatchNorm2d(c)});
  };
  return Sequential{Conv2d(1, 16, 3, 1, 1, false),
                    BatchNorm2d(16),
                    ReLU(),
                    block(16),
                    ReLU(),
                    Conv2d(16, 32, 3, 2, 1, false),
                    BatchNorm2d(32),
                    ReLU(),
                    block(32),
                    ReLU(),
                    GlobalAvgPool2d(),
                    Linear(32, 10)};
}

} // namespace kiln::nn::models
