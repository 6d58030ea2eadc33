// Eigen views of kiln's host memory, for trainers that already hold their data in Eigen:
// parameters, inputs and outputs as Eigen::Map, without copies. Needs Eigen 3.4 (not
// included by kiln.hpp, since kiln itself does not depend on Eigen).
#pragma once

#include <span>
#include <string>
#include <utility>

#include <Eigen/Core>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/runtime/executor.hpp"

namespace kiln::eigen {

/// Row-major float matrices: kiln's tensors are row-major (the last axis varies fastest).
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<Matrix>;
using ConstMatrixMap = Eigen::Map<const Matrix>;

namespace detail {

/// [first axis, product of the others]; a scalar or a vector is one row.
inline std::pair<Eigen::Index, Eigen::Index> matrix_shape(const Shape& s, const std::string& what) {
  if (s.numel() == 0)
    fail(errc::shape, what + ": an empty tensor " + s.str() + " has no matrix view");
  if (s.rank() < 2) return {1, s.numel()};
  return {s[0], s.numel() / s[0]};
}

} // namespace detail

/// A parameter or any f32 host tensor as a [first axis, rest] matrix: a Linear layer's weight
/// [out, in] as is, a convolution's [O, C, KH, KW] as [O, C*KH*KW]. Writes go to the tensor.
inline MatrixMap matrix(Tensor& t) {
  if (t.dtype() != DType::f32) fail(errc::dtype, "eigen::matrix: the tensor is not f32");
  const auto [rows, cols] = detail::matrix_shape(t.shape(), "eigen::matrix");
  return {t.f32().data(), rows, cols};
}
inline ConstMatrixMap matrix(const Tensor& t) {
  if (t.dtype() != DType::f32) fail(errc::dtype, "eigen::matrix: the tensor is not f32");
  const auto [rows, cols] = detail::matrix_shape(t.shape(), "eigen::matrix");
  return {t.f32().data(), rows, cols};
}

/// The executor's own memory for f32 input `name` as a [batch, rest] matrix: fill it (e.g.
/// `input(exe, "x") = my_batch;`) and run(), with no copy in between. Host-memory devices only.
inline MatrixMap input(Executor& exe, const std::string& name) {
  const std::span<float> memory = exe.input_memory(name); // fails naming the known inputs
  Shape shape;
  for (const PlanInput& in : exe.plan().inputs)
    if (in.name == name) shape = in.buffer.shape;
  const auto [rows, cols] = detail::matrix_shape(shape, "eigen::input('" + name + "')");
  return {memory.data(), rows, cols};
}

/// Graph output `v` after the last run as a [first axis, rest] matrix (e.g. logits [N, 10]).
inline ConstMatrixMap output(const Executor& exe, Value v) {
  const std::span<const float> values = exe.output(v);
  const Shape shape = v.node().type.shape;
  const auto [rows, cols] = detail::matrix_shape(shape, "eigen::output");
  return {values.data(), rows, cols};
}

} // namespace kiln::eigen
