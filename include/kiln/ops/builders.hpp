// The builder functions of every op family, declared together so that gradient rules of one
// family can build nodes of another. Definitions live in the family headers (ops/*.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/ir/graph.hpp"

namespace kiln {

/// Appends a node of `op` to `g` after inferring its type from the op's definition; throws
/// kiln::Error naming the node when its inputs or attributes do not fit. Every builder below
/// goes through it. Defined in ops/registry.hpp, beside the op table.
Value append(Graph& g, Op op, std::vector<ValueId> inputs, Attrs attrs = NoAttrs{});

// elementwise (ops/elementwise.hpp); binary ops broadcast numpy-style
Value add(Value a, Value b);
Value sub(Value a, Value b);
Value mul(Value a, Value b);
Value div(Value a, Value b);
Value neg(Value x);
Value relu(Value x);
Value relu_grad(Value y, Value dy);
Value exp(Value x);
Value log(Value x);
Value sqrt(Value x);
Value rsqrt(Value x);
Value square(Value x);
Value mul_scalar(Value x, float s);
Value add_scalar(Value x, float s);
Value broadcast_to(Value x, Shape shape);
Value dropout_mask(Graph& g, Shape shape, float p, std::uint64_t seed);

// state (ops/state.hpp)
Value fill(Graph& g, Shape shape, float value);
Value assign(Value target, Value new_value);

// reductions (ops/reduce.hpp)
Value sum_to(Value x, Shape shape);
Value sum(Value x);
Value mean(Value x);

// shape (ops/shape.hpp)
Value reshape(Value x, Shape shape);
Value flatten(Value x);
/// Permutes the axes (numpy.transpose): output dimension i is input dimension perm[i].
Value transpose(Value x, std::vector<int> perm);

// anchors (ops/matmul.hpp, ops/conv.hpp)
Value matmul(Value a, Value b, bool transpose_a = false, bool transpose_b = false);
/// Convolution options; the weight is OIHW.
struct Conv2dOptions {
  int stride = 1;
  int padding = 0;
};
Value conv2d(Value x, Value w, Conv2dOptions options = {});
Value conv2d_grad_input(Value dy, Value w, const Conv2dAttrs& attrs);
Value conv2d_grad_weight(Value x, Value dy, const Conv2dAttrs& attrs);

// pooling (ops/pool.hpp)
/// Pooling options; stride 0 means stride = kernel. `channels_last`: x is [N, H, W, C], and
/// so is the pooled result.
struct Pool2dOptions {
  int kernel = 2;
  int stride = 0;
  int padding = 0;
  bool channels_last = false;
};
Value max_pool2d(Value x, Pool2dOptions options = {});
Value max_pool2d_grad(Value x, Value dy, const Pool2dAttrs& attrs);
Value avg_pool2d(Value x, Pool2dOptions options = {});
Value avg_pool2d_grad(Value dy, const Pool2dAttrs& attrs);
Value global_avg_pool2d(Value x);

// softmax and losses (ops/loss.hpp)
Value log_softmax(Value x);
Value log_softmax_grad(Value y, Value dy);
Value softmax_cross_entropy(Value logits, Value labels);
Value softmax_cross_entropy_grad(Value logits, Value labels, Value dloss);

inline Value operator+(Value a, Value b) { return add(a, b); }
inline Value operator-(Value a, Value b) { return sub(a, b); }
inline Value operator*(Value a, Value b) { return mul(a, b); }
inline Value operator/(Value a, Value b) { return div(a, b); }
inline Value operator-(Value x) { return neg(x); }
inline Value operator*(Value x, float s) { return mul_scalar(x, s); }
inline Value operator*(float s, Value x) { return mul_scalar(x, s); }
inline Value operator+(Value x, float s) { return add_scalar(x, s); }

} // namespace kiln
