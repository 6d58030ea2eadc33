// The CUDA backend on top of <kiln/kiln.hpp>: kiln::compile(graph, kiln::cuda_backend()).
// Needs the CUDA runtime headers and the kiln::cuda target (its kernels and libcudart).
#pragma once

#include "kiln/backends/cuda/backend.hpp"
#include "kiln/kiln.hpp"
