// kiln: a small DNN graph compiler for training. The umbrella include for the CPU backend.
// Exactly one .cpp of the program must also include "kiln/backends/cpu/implementation.hpp".
#pragma once

#include "kiln/autodiff/gradients.hpp"
#include "kiln/compile.hpp"
#include "kiln/core/error.hpp"
#include "kiln/data/data.hpp"
#include "kiln/grad_check.hpp"
#include "kiln/ir/dot.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/ir/printer.hpp"
#include "kiln/nn/nn.hpp"
#include "kiln/ops/ops.hpp"
#include "kiln/ops/verifier.hpp"
#include "kiln/train/checkpoint.hpp"
#include "kiln/train/metrics.hpp"
#include "kiln/train/optimizers.hpp"
#include "kiln/train/train_step.hpp"
