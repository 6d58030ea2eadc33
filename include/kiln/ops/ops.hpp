// The ops module: every op family and the op table.
#pragma once

#include "kiln/ops/registry.hpp"
