// Log-softmax and softmax cross-entropy with integer labels, with their gradients.
#pragma once

#include "kiln/ops/builders.hpp"
#include "kiln/ops/op_def.hpp"

namespace kiln {

namespace detail {
/// Logits f32 [N,K] and labels i32 [N] of the same batch.
inline void check_logits_and_labels(const InferContext& c) {
  c.expect_dtype(0, DType::f32);
  c.expect_dtype(1, DType::i32);
  c.expect_rank(0, 2);
  c.expect_rank(1, 1);
  if (c.in(0).shape[0] != c.in(1).shape[0])
    c.fail(errc::shape, "batch of logits " + c.in(0).shape.str() + " differs from labels " +
                            c.in(1).shape.str());
}
} // namespace detail

template <> struct OpDef<Op::LogSoftmax> : OpDefaults {
  static constexpr int arity = 1;
  static constexpr FusionKind kind = FusionKind::reduction;
  /// exp, sum, log and subtract per logit.
  static std::int64_t flops(const CostContext& c) { return 4 * c.in[0].numel(); }
  static TensorType infer(const InferContext& c) {
    c.expect_dtype(0, DType::f32);
    if (c.in(0).shape.rank() < 1) c.fail(errc::shape, "log_softmax needs at least one dimension");
    return c.in(0);
  }
  static void grad(GradContext& c) { c.dx[0] = log_softmax_grad(c.out(), c.dy); }
};

/// dx = dy - exp(y) * sum(dy) along the last axis, y = log_softmax(x).
template <> struct OpDef<Op::LogSoftmaxGrad> : OpDefaults {
  static constexpr int arity = 2;
  static constexpr FusionKind kind = FusionKind::reduction;
  static TensorType infer(const InferContext& c) { return c.in(0); }
  static constexpr GradFn grad = nullptr;
};

/// Mean over the batch of -log softmax(logits)[label]; logits [N,K], labels i32 [N].
template <> struct OpDef<Op::SoftmaxCrossEntropy> : OpDefaults {
  static constexpr int arity = 2;
  static constexpr FusionKind kind = FusionKind::reduction;
  /// exp, sum, log and subtract per logit.
  static std::int64_t flops(const CostContext& c) { return 4 * c.in[0].numel(); }
  static TensorType infer(const InferContext& c) {
    detail::check_logits_and_labels(c);
    return TensorType{Shape{}, DType::f32};
  }
  static void grad(GradContext& c) {
    if (c.wants(0)) c.dx[0] = softmax_cross_entropy_grad(c.in(0), c.in(1), c.dy);
  }
};

template <> struct OpDef<Op::SoftmaxCrossEntropyGrad> : OpDefaults {
  static constexpr int arity = 3;
  static constexpr FusionKind kind = FusionKind::reduction;
  /// The loss and its gradient from one pass over the logits.
  static constexpr JointKernel joint{true, Op::SoftmaxCrossEntropy,
                                     Op::SoftmaxCrossEntropyWithGrad};
  static TensorType infer(const InferContext& c) { return c.in(0); }
  static constexpr GradFn grad = nullptr;
};

/// The loss and its gradient from one pass over the logits, side by side in one flat
/// result: the gradient [N,K] (as softmax_cross_entropy_grad), then the loss (one element).
/// Made by the fuse_loss pass, which names the two with part views.
template <> struct OpDef<Op::SoftmaxCrossEntropyWithGrad> : OpDefaults {
  static constexpr int arity = 3;
  static constexpr FusionKind kind = FusionKind::reduction;
  /// exp, sum, log and subtract per logit.
  static std::int64_t flops(const CostContext& c) { return 4 * c.in[0].numel(); }
  static TensorType infer(const InferContext& c) {
    detail::check_logits_and_labels(c);
    if (c.in(2).shape.numel() != 1) c.fail(errc::shape, "the loss gradient must be one value");
    return TensorType{Shape{c.in(0).shape.numel() + 1}, DType::f32};
  }
  static constexpr GradFn grad = nullptr;
};

inline Value log_softmax(Value x) { return append(*x.graph, Op::LogSoftmax, {x.id}); }
inline Value log_softmax_grad(Value y, Value dy) {
  return append(*y.graph, Op::LogSoftmaxGrad, {y.id, dy.id});
}

/// The mean cross-entropy of softmax(logits) against integer class labels. When `labels`
/// is a graph input, the executor checks every fed label lies in [0, K).
inline Value softmax_cross_entropy(Value logits, Value labels) {
  if (!logits.valid() || !labels.valid() || logits.graph != labels.graph)
    fail(errc::argument, "softmax_cross_entropy: values must belong to one graph");
  Value loss = append(*logits.graph, Op::SoftmaxCrossEntropy, {logits.id, labels.id});
  Node& label_node = labels.graph->node(labels.id);
  if (auto* in = std::get_if<InputAttrs>(&label_node.attrs)) in->label_classes = logits.shape()[1];
  return loss;
}

inline Value softmax_cross_entropy_grad(Value logits, Value labels, Value dloss) {
  return append(*logits.graph, Op::SoftmaxCrossEntropyGrad, {logits.id, labels.id, dloss.id});
}

} // namespace kiln
