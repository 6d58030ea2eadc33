// The CPU kernels as one translation unit, built into the kiln::cpu_kernels library.
#include "kiln/backends/cpu/implementation.hpp"
