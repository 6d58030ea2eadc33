// Matrix multiply (the linear layer's anchor) with transpose flags, and its gradient.
#pragma once

#include "kiln/ops/builders.hpp"
#include "kiln/ops/op_def.hpp"
#include "kiln/ops/program_check.hpp"

namespace kiln {

template <> struct OpDef<Op::MatMul> : OpDefaults {
  static constexpr int arity = -1; // 2, plus its epilogue's inputs

  static constexpr FusionKind kind = FusionKind::anchor;
  static std::int64_t flops(const CostContext& c) {
    const std::int64_t k = std::get<MatMulAttrs>(c.attrs).transpose_a ? c.in[0][0] : c.in[0][1];
    return 2 * c.out.numel() * k + epilogue_flops(c);
  }
  static TensorType infer(const InferContext& c) {
    const auto& a = c.attr<MatMulAttrs>();
    detail::check_anchor_arity(c, a.epilogue);
    c.expect_dtype(0, DType::f32);
    c.expect_dtype(1, DType::f32);
    c.expect_rank(0, 2);
    c.expect_rank(1, 2);
    const Shape& sa = c.in(0).shape;
    const Shape& sb = c.in(1).shape;
    const std::int64_t m = a.transpose_a ? sa[1] : sa[0];
    const std::int64_t ka = a.transpose_a ? sa[0] : sa[1];
    const std::int64_t kb = a.transpose_b ? sb[1] : sb[0];
    const std::int64_t n = a.transpose_b ? sb[0] : sb[1];
    if (ka != kb)
      c.fail(errc::shape,
             "inner dimensions differ: " + std::to_string(ka) + " vs " + std::to_string(kb));
    detail::check_epilogue(c, a.epilogue, Shape{m, n});
    return TensorType{Shape{m, n}, DType::f32};
  }
  static void grad(GradContext& c) {
    const auto& a = c.attr<MatMulAttrs>();
    if (!a.epilogue.empty()) fail(errc::graph, "matmul with a fused epilogue has no gradient");
    const Value A = c.in(0), B = c.in(1), dC = c.dy;
    // C = op(A) op(B); each case writes the gradient in the stored layout of A and B.
    if (c.wants(0)) {
      if (!a.transpose_a)
        c.dx[0] = a.transpose_b ? matmul(dC, B) : matmul(dC, B, false, true);
      else
        c.dx[0] = a.transpose_b ? matmul(B, dC, true, true) : matmul(B, dC, false, true);
    }
    if (c.wants(1)) {
      if (!a.transpose_b)
        c.dx[1] = a.transpose_a ? matmul(A, dC) : matmul(A, dC, true, false);
      else
        c.dx[1] = a.transpose_a ? matmul(dC, A, true, true) : matmul(dC, A, true, false);
    }
  }
};

inline Value matmul(Value a, Value b, bool transpose_a, bool transpose_b) {
  if (!a.valid() || !b.valid() || a.graph != b.graph)
    fail(errc::argument, "matmul: values must belong to one graph");
  return append(*a.graph, Op::MatMul, {a.id, b.id}, MatMulAttrs{transpose_a, transpose_b});
}

} // namespace kiln
