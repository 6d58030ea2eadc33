// Kernel variants per op, and the selection every backend makes from them: the first variant
// whose rule accepts a call. Backends fill one table each (the CPU's per SIMD target, CUDA's).
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/ir/op_list.hpp"
#include "kiln/plan/backend.hpp"

namespace kiln {

/// One kernel of an op: a variant (e.g. convolution over shifted rows) with its own rule for
/// the calls it can run and its own scratch need.
struct KernelVariant {
  const char* name = ""; ///< e.g. "conv2d.shifted_rows"
  KernelFn run = nullptr;
  /// Whether it runs this call; null: every call.
  bool (*accepts)(const KernelQuery&) = nullptr;
  /// Scratch bytes per worker for this call; null: none.
  std::size_t (*workspace)(const KernelQuery&) = nullptr;
  /// What it multiplies in: a call compiled for Precision::bf16 takes a bf16 variant where one
  /// accepts it, and an FP32 one otherwise.
  Precision precision = Precision::f32;
};

/// Every op's variants. The `accepts` rules of the variants of one precision exclude each
/// other, so the order they were added in decides nothing.
struct VariantTable {
  std::array<std::vector<KernelVariant>, op_count> variants{};

  void add(Op op, const KernelVariant& variant) { variants[op_index(op)].push_back(variant); }

  /// The first variant of the call's op that accepts it, with its scratch need; without one,
  /// the reason, naming `device` ("the CPU") when the op has no kernel at all.
  [[nodiscard]] KernelChoice select(const KernelQuery& query, std::string_view device) const {
    const std::vector<KernelVariant>& list = variants[op_index(query.op)];
    const auto first_of = [&](Precision precision) -> const KernelVariant* {
      for (const KernelVariant& v : list)
        if (v.precision == precision && (!v.accepts || v.accepts(query))) return &v;
      return nullptr;
    };
    const KernelVariant* chosen =
        query.precision == Precision::bf16 ? first_of(Precision::bf16) : nullptr;
    if (!chosen) chosen = first_of(Precision::f32);
    if (chosen)
      return {chosen->run, chosen->workspace ? chosen->workspace(query) : 0, chosen->name};
    if (list.empty()) return {nullptr, 0, std::string(device) + " has no kernel for this op"};
    std::string names;
    for (const KernelVariant& v : list) names += (names.empty() ? "" : ", ") + std::string(v.name);
    return {nullptr, 0, "none of its kernels (" + names + ") takes these shapes and attributes"};
  }

  /// select() for a call whose arguments are already laid out (data pointers may be null), for
  /// tests and micro-benchmarks that call kernels directly.
  [[nodiscard]] KernelChoice select(Op op, const KernelArgs& args, std::string_view device,
                                    Precision precision = Precision::f32) const {
    std::array<TensorType, max_op_inputs> types{};
    for (int i = 0; i < args.num_inputs; ++i) {
      const TensorView& in = args.in[static_cast<std::size_t>(i)];
      types[static_cast<std::size_t>(i)] = TensorType{in.shape, in.dtype};
    }
    return select(KernelQuery{op, args.attrs,
                              std::span<const TensorType>(
                                  types.data(), static_cast<std::size_t>(args.num_inputs)),
                              TensorType{args.out.shape, args.out.dtype}, precision},
                  device);
  }
};

} // namespace kiln
