// The CPU backend: Highway SIMD kernels (best target chosen at run time), oneTBB threads.
#pragma once

#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/workspace.hpp"
#include "kiln/runtime/backend.hpp"

namespace kiln {

/// The CPU backend. Its kernels come from kiln/backends/cpu/implementation.hpp, which one
/// .cpp file of the program must include.
inline Backend cpu_backend() {
  Backend b;
  b.name = "cpu";
  b.kernel = [](Op op) { return cpu::kernel_table().run[op_index(op)]; };
  b.workspace_per_thread = &cpu::workspace_per_thread;
  b.target = [] { return cpu::kernel_table().target_name; };
  return b;
}

} // namespace kiln
