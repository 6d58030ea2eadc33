// The nn module: layers that build subgraphs and own their parameters.
#pragma once

#include "kiln/nn/batch_norm2d.hpp"
#include "kiln/nn/conv2d.hpp"
#include "kiln/nn/init.hpp"
#include "kiln/nn/linear.hpp"
#include "kiln/nn/models.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/nn/residual.hpp"
#include "kiln/nn/sequential.hpp"
#include "kiln/nn/simple_layers.hpp"
