// The scalar reference of every op with a kernel, for the op harness: plain loops in double
// where they sum, over NCHW operands (the harness undoes a channels-last form first).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <variant>
#include <vector>

#include "kiln/core/rng.hpp"
#include "kiln/kiln.hpp"
#include "kiln/ops/scalar_body.hpp"
#include "ops/reference_gemm_conv.hpp"
#include "ops/reference_pool_softmax.hpp"

namespace kiln::test {

/// The elements of one operand: floats for f32, integers for i32.
struct Values {
  std::vector<float> f32;
  std::vector<std::int32_t> i32;
};

/// A reference call: the operands (NCHW), their shapes, the output shape and the attributes.
struct RefCall {
  std::span<const Values> in;
  std::span<const Shape> shape;
  Shape out;
  const Attrs& attrs;
};

using ReferenceFn = std::vector<float> (*)(const RefCall&);

namespace ref {

/// x of shape `s` with its axes permuted (numpy.transpose): output axis i is input axis perm[i].
inline std::vector<float> transposed(const std::vector<float>& x, const Shape& s,
                                     std::span<const int> perm) {
  const Shape ys = permuted(s, perm);
  const int rank = s.rank();
  std::array<std::int64_t, Shape::max_rank> stride{}, idx{};
  for (int a = rank - 1, step = 1; a >= 0; --a) {
    stride[static_cast<std::size_t>(a)] = step;
    step *= static_cast<int>(s[a]);
  }
  std::vector<float> y(x.size());
  for (std::int64_t flat = 0; flat < ys.numel(); ++flat) {
    std::int64_t src = 0;
    for (int i = 0; i < rank; ++i)
      src += idx[static_cast<std::size_t>(i)] *
             stride[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])];
    y[static_cast<std::size_t>(flat)] = x[static_cast<std::size_t>(src)];
    for (int i = rank - 1; i >= 0; --i) {
      if (++idx[static_cast<std::size_t>(i)] < ys[i]) break;
      idx[static_cast<std::size_t>(i)] = 0;
    }
  }
  return y;
}

/// Index of the element of an input of shape `in` that output index `flat` reads.
inline std::int64_t broadcast_index(const Shape& out, const Shape& in, std::int64_t flat) {
  const Shape padded = pad_rank(in, out.rank());
  std::int64_t index = 0, stride = 1;
  for (int d = out.rank() - 1; d >= 0; --d) {
    const std::int64_t coord = flat % out[d];
    flat /= out[d];
    if (padded[d] != 1) index += coord * stride;
    stride *= padded[d];
  }
  return index;
}

/// An elementwise op: its own body, element by element, operands broadcast to the output.
template <Op op> std::vector<float> elementwise(const RefCall& c) {
  const auto* scalar = std::get_if<ScalarAttrs>(&c.attrs);
  std::vector<float> out(static_cast<std::size_t>(c.out.numel()));
  for (std::int64_t i = 0; i < c.out.numel(); ++i) {
    const float a = c.in[0].f32[static_cast<std::size_t>(broadcast_index(c.out, c.shape[0], i))];
    const float b =
        c.in.size() > 1
            ? c.in[1].f32[static_cast<std::size_t>(broadcast_index(c.out, c.shape[1], i))]
            : a;
    out[static_cast<std::size_t>(i)] = scalar_body<op>(a, b, scalar ? scalar->value : 0.0f);
  }
  return out;
}

/// A fused program: every step's scalar body, element by element.
inline std::vector<float> fused(const RefCall& c) {
  const FusedAttrs& a = std::get<FusedAttrs>(c.attrs);
  static constexpr auto bodies = scalar_bodies();
  std::vector<float> out(static_cast<std::size_t>(c.out.numel())), steps(a.program.size());
  for (std::int64_t i = 0; i < c.out.numel(); ++i) {
    const auto operand = [&](int v) {
      if (v >= 0) return steps[static_cast<std::size_t>(v)];
      const auto k = static_cast<std::size_t>(-(v + 1));
      return c.in[k].f32[static_cast<std::size_t>(broadcast_index(c.out, c.shape[k], i))];
    };
    for (std::size_t s = 0; s < a.program.size(); ++s) {
      const FusedInstruction& f = a.program[s];
      steps[s] = bodies[op_index(f.op)](operand(f.a), operand(f.b), f.scalar);
    }
    out[static_cast<std::size_t>(i)] = steps.back();
  }
  return out;
}

/// A summed chain: the chain's result over its shape, summed as sum_to sums it.
inline std::vector<float> fused_sum_to(const RefCall& c) {
  const FusedSumAttrs& a = std::get<FusedSumAttrs>(c.attrs);
  const Attrs chain = a.chain;
  return ref::sum_to(fused(RefCall{c.in, c.shape, a.chain.shape, chain}), a.chain.shape, c.out);
}

inline std::vector<float> fill(const RefCall& c) {
  return std::vector<float>(static_cast<std::size_t>(c.out.numel()),
                            std::get<FillAttrs>(c.attrs).value);
}

/// The mask of the first run: its definition, element by element from (seed, run 0, index).
inline std::vector<float> dropout_mask(const RefCall& c) {
  const DropoutAttrs& a = std::get<DropoutAttrs>(c.attrs);
  const std::uint64_t stream = mix64(a.seed ^ mix64(0x5bd1e995ULL));
  std::vector<float> out(static_cast<std::size_t>(c.out.numel()));
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = unit_float(mix64(stream + i)) < a.p ? 0.0f : 1.0f / (1.0f - a.p);
  return out;
}

/// An update's value: what it writes into the param.
inline std::vector<float> assign(const RefCall& c) { return c.in[1].f32; }

/// A view: the elements of its input from the view's offset on.
inline std::vector<float> view(const RefCall& c) {
  const auto* part = std::get_if<PartAttrs>(&c.attrs);
  const auto first = static_cast<std::ptrdiff_t>(part ? part->offset : 0);
  return {c.in[0].f32.begin() + first, c.in[0].f32.begin() + first + c.out.numel()};
}

/// An all-reduce's start packs its operands one after another.
inline std::vector<float> concatenate(const RefCall& c) {
  std::vector<float> all;
  for (const Values& v : c.in) all.insert(all.end(), v.f32.begin(), v.f32.end());
  return all;
}

inline std::vector<float> transpose(const RefCall& c) {
  return transposed(c.in[0].f32, c.shape[0], std::get<TransposeAttrs>(c.attrs).perm);
}

inline std::vector<float> sum_to(const RefCall& c) {
  return ref::sum_to(c.in[0].f32, c.shape[0], c.out);
}

inline std::vector<float> matmul(const RefCall& c) {
  const auto& a = std::get<MatMulAttrs>(c.attrs);
  const auto k = static_cast<std::size_t>(a.transpose_a ? c.shape[0][0] : c.shape[0][1]);
  return ref::matmul(c.in[0].f32, c.in[1].f32, static_cast<std::size_t>(c.out[0]),
                     static_cast<std::size_t>(c.out[1]), k, a.transpose_a, a.transpose_b);
}

/// The geometry of a convolution from its image x [N,C,H,W] and weight [O,C,KH,KW] shapes.
inline ConvShape conv_shape(const Attrs& attrs, const Shape& x, const Shape& w) {
  const auto& a = std::get<Conv2dAttrs>(attrs);
  const auto u = [](std::int64_t v) { return static_cast<std::size_t>(v); };
  return {u(x[0]), u(x[1]),       u(x[2]),       u(x[3]),    u(w[0]),   u(w[2]),
          u(w[3]), u(a.stride_h), u(a.stride_w), u(a.pad_h), u(a.pad_w)};
}

inline std::vector<float> conv2d(const RefCall& c) {
  return ref::conv2d(conv_shape(c.attrs, c.shape[0], c.shape[1]), c.in[0].f32, c.in[1].f32);
}
inline std::vector<float> conv2d_grad_input(const RefCall& c) {
  return ref::conv2d_grad_input(conv_shape(c.attrs, c.out, c.shape[1]), c.in[0].f32, c.in[1].f32);
}
inline std::vector<float> conv2d_grad_weight(const RefCall& c) {
  return ref::conv2d_grad_weight(conv_shape(c.attrs, c.shape[0], c.out), c.in[0].f32, c.in[1].f32);
}

inline std::vector<float> maxpool2d(const RefCall& c) {
  return ref::maxpool2d(c.in[0].f32, c.shape[0], std::get<Pool2dAttrs>(c.attrs));
}
inline std::vector<float> maxpool2d_grad(const RefCall& c) {
  return ref::maxpool2d_grad(c.in[0].f32, c.shape[0], c.in[1].f32, std::get<Pool2dAttrs>(c.attrs));
}
inline std::vector<float> avgpool2d(const RefCall& c) {
  return ref::avgpool2d(c.in[0].f32, c.shape[0], std::get<Pool2dAttrs>(c.attrs));
}
inline std::vector<float> avgpool2d_grad(const RefCall& c) {
  return ref::avgpool2d_grad(c.in[0].f32, c.out, std::get<Pool2dAttrs>(c.attrs));
}

inline std::int64_t last_dim(const Shape& s) { return s.rank() ? s[s.rank() - 1] : 1; }

inline std::vector<float> log_softmax(const RefCall& c) {
  return ref::log_softmax(c.in[0].f32, last_dim(c.shape[0]));
}
inline std::vector<float> log_softmax_grad(const RefCall& c) {
  return ref::log_softmax_grad(c.in[0].f32, c.in[1].f32, last_dim(c.shape[0]));
}
inline std::vector<float> softmax_cross_entropy(const RefCall& c) {
  return {ref::softmax_cross_entropy(c.in[0].f32, c.in[1].i32, c.shape[0][1])};
}
inline std::vector<float> softmax_cross_entropy_grad(const RefCall& c) {
  return ref::softmax_cross_entropy_grad(c.in[0].f32, c.in[1].i32, c.shape[0][1], c.in[2].f32[0]);
}
/// The gradient, then the loss, side by side.
inline std::vector<float> softmax_cross_entropy_with_grad(const RefCall& c) {
  std::vector<float> both = softmax_cross_entropy_grad(c);
  both.push_back(softmax_cross_entropy(c)[0]);
  return both;
}

} // namespace ref

/// The reference of `op`: the elementwise ops' from their own bodies, the others' written out
/// above; null for ops without a kernel or view to check (graph inputs, params).
inline ReferenceFn reference_of(Op op) {
  static const std::array<ReferenceFn, op_count> table = [] {
    std::array<ReferenceFn, op_count> t{};
#define KILN_TEST_ELEMENTWISE_REFERENCE(name, spelling)                                            \
  if constexpr (OpDef<Op::name>::is_elementwise)                                                   \
    t[op_index(Op::name)] = &ref::elementwise<Op::name>;
    KILN_OP_LIST(KILN_TEST_ELEMENTWISE_REFERENCE)
#undef KILN_TEST_ELEMENTWISE_REFERENCE
    const auto set = [&t](Op o, ReferenceFn f) { t[op_index(o)] = f; };
    set(Op::FusedElementwise, &ref::fused);
    set(Op::FusedSumTo, &ref::fused_sum_to);
    set(Op::Fill, &ref::fill);
    set(Op::DropoutMask, &ref::dropout_mask);
    set(Op::Assign, &ref::assign);
    set(Op::Reshape, &ref::view);
    set(Op::Part, &ref::view);
    set(Op::Transpose, &ref::transpose);
    set(Op::AllreduceStart, &ref::concatenate);
    set(Op::AllreduceWait, &ref::view); // one rank: the average is the data
    set(Op::SumTo, &ref::sum_to);
    set(Op::MatMul, &ref::matmul);
    set(Op::Conv2d, &ref::conv2d);
    set(Op::Conv2dGradInput, &ref::conv2d_grad_input);
    set(Op::Conv2dGradWeight, &ref::conv2d_grad_weight);
    set(Op::MaxPool2d, &ref::maxpool2d);
    set(Op::MaxPool2dGrad, &ref::maxpool2d_grad);
    set(Op::AvgPool2d, &ref::avgpool2d);
    set(Op::AvgPool2dGrad, &ref::avgpool2d_grad);
    set(Op::LogSoftmax, &ref::log_softmax);
    set(Op::LogSoftmaxGrad, &ref::log_softmax_grad);
    set(Op::SoftmaxCrossEntropy, &ref::softmax_cross_entropy);
    set(Op::SoftmaxCrossEntropyGrad, &ref::softmax_cross_entropy_grad);
    set(Op::SoftmaxCrossEntropyWithGrad, &ref::softmax_cross_entropy_with_grad);
    return t;
  }();
  return table[op_index(op)];
}

} // namespace kiln::test
