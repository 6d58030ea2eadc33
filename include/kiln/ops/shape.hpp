// Shape ops: reshape and flatten, views that alias their input's memory, and transpose, which
// permutes axes into a new buffer.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kiln/ops/builders.hpp"
#include "kiln/ops/op_def.hpp"

namespace kiln {

template <> struct OpDef<Op::Reshape> : OpDefaults {
  /// Moves data, computes nothing.
  static std::int64_t flops(const CostContext&) { return 0; }
  static constexpr int arity = 1;
  static constexpr FusionKind kind = FusionKind::injective;
  static constexpr bool is_view = true;
  static TensorType infer(const InferContext& c) {
    const Shape& to = c.attr<ShapeAttrs>().shape;
    if (to.numel() != c.in(0).shape.numel())
      c.fail(errc::shape, "cannot reshape " + c.in(0).shape.str() + " to " + to.str());
    return TensorType{to, c.in(0).dtype};
  }
  static void grad(GradContext& c) { c.dx[0] = reshape(c.dy, c.in(0).shape()); }
};

/// part(x, offset, shape): the elements [offset, offset + numel(shape)) of x's memory seen as
/// `shape`. Made by passes to name the results a multi-result kernel writes side by side.
template <> struct OpDef<Op::Part> : OpDefaults {
  /// Moves data, computes nothing.
  static std::int64_t flops(const CostContext&) { return 0; }
  static constexpr int arity = 1;
  static constexpr FusionKind kind = FusionKind::injective;
  static constexpr bool is_view = true;
  static TensorType infer(const InferContext& c) {
    const auto& a = c.attr<PartAttrs>();
    if (a.offset < 0 || a.offset + a.shape.numel() > c.in(0).shape.numel())
      c.fail(errc::attr, "part at " + std::to_string(a.offset) + " of " + a.shape.str() +
                             " does not fit in " + c.in(0).shape.str());
    return TensorType{a.shape, c.in(0).dtype};
  }
  static constexpr GradFn grad = nullptr;
};

namespace detail {
/// The permutation that undoes `perm`.
inline std::vector<int> inverse_perm(const std::vector<int>& perm) {
  std::vector<int> inv(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i)
    inv[static_cast<std::size_t>(perm[i])] = static_cast<int>(i);
  return inv;
}
} // namespace detail

/// transpose(x, perm): output dimension i is input dimension perm[i] (numpy.transpose). Not
/// a view: the CPU kernel writes the permuted elements into a new buffer. Any dtype.
template <> struct OpDef<Op::Transpose> : OpDefaults {
  /// Moves data, computes nothing.
  static std::int64_t flops(const CostContext&) { return 0; }
  static constexpr int arity = 1;
  static constexpr FusionKind kind = FusionKind::injective;
  static TensorType infer(const InferContext& c) {
    const std::vector<int>& perm = c.attr<TransposeAttrs>().perm;
    const Shape& x = c.in(0).shape;
    const int rank = x.rank();
    bool ok = static_cast<int>(perm.size()) == rank;
    std::vector<bool> seen(static_cast<std::size_t>(rank), false);
    for (std::size_t i = 0; ok && i < perm.size(); ++i) {
      ok = perm[i] >= 0 && perm[i] < rank && !seen[static_cast<std::size_t>(perm[i])];
      if (ok) seen[static_cast<std::size_t>(perm[i])] = true;
    }
    if (!ok)
      c.fail(errc::attr, "perm " + perm_text(perm) + " is not a permutation of 0.." +
                             std::to_string(rank - 1) + " (input rank " + std::to_string(rank) +
                             ")");
    return TensorType{permuted(x, perm), c.in(0).dtype};
  }
  static void grad(GradContext& c) {
    c.dx[0] = transpose(c.dy, detail::inverse_perm(c.attr<TransposeAttrs>().perm));
  }
  /// With the batch axis first in both, images move independently: a kernel that stages
  /// each image before writing it back (the CPU one does) can reorder in place.
  static int overwritable_input(const Attrs& attrs) {
    const auto* a = std::get_if<TransposeAttrs>(&attrs);
    return a && a->perm.size() > 1 && a->perm[0] == 0 ? 0 : -1;
  }
};

/// Reshapes x; one dimension may be -1 and is then inferred.
inline Value reshape(Value x, Shape shape) {
  int inferred = -1;
  std::int64_t known = 1;
  for (int i = 0; i < shape.rank(); ++i) {
    if (shape[i] == -1 && inferred < 0) {
      inferred = i;
    } else if (shape[i] <= 0) {
      fail(errc::shape, "reshape of %" + std::to_string(x.id) + ":" + x.shape().str() + " to " +
                            shape.str() + ": dimensions must be positive (one may be -1)");
    } else {
      known *= shape[i];
    }
  }
  if (inferred >= 0) shape[inferred] = known > 0 ? x.shape().numel() / known : 0;
  if (x.shape() == shape) return x;
  return append(*x.graph, Op::Reshape, {x.id}, ShapeAttrs{shape});
}

/// Permutes x's axes; the identity permutation returns x itself.
inline Value transpose(Value x, std::vector<int> perm) {
  bool identity = static_cast<int>(perm.size()) == x.shape().rank();
  for (std::size_t i = 0; identity && i < perm.size(); ++i)
    identity = perm[i] == static_cast<int>(i);
  if (identity) return x;
  return append(*x.graph, Op::Transpose, {x.id}, TransposeAttrs{std::move(perm)});
}

/// [N, ...] -> [N, rest].
inline Value flatten(Value x) {
  if (x.shape().rank() < 1) fail(errc::shape, "flatten of a scalar %" + std::to_string(x.id));
  return reshape(x, Shape{x.shape()[0], -1});
}

} // namespace kiln
