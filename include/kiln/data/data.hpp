// kiln data module: IDX reading, MNIST-style datasets and the batching loader. Link with -lz.
#pragma once

#include "kiln/data/dataset.hpp"
#include "kiln/data/idx.hpp"
#include "kiln/data/loader.hpp"
