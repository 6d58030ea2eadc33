// Scratch memory each CPU kernel needs per worker thread; the planner reserves it.
#pragma once

#include <cstddef>

#include "kiln/ops/op_list.hpp"
#include "kiln/runtime/kernel_args.hpp"

namespace kiln::cpu {

/// Bytes of scratch memory the kernel of `op` needs per worker thread for these shapes
/// (args.in[i].shape, args.out.shape, args.attrs are set; data pointers are not).
inline std::size_t workspace_per_thread(Op op, const KernelArgs& args) {
  (void)op;
  (void)args;
  return 0;
}

} // namespace kiln::cpu
