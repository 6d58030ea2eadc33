// The op harness: rows of (op, operands with their input domains, attributes, tolerance),
// checked the same way for every op, through the backend contract: a backend's kernel against
// the op's scalar reference, in place exactly where the op's definition allows it, and the
// op's gradient against central finite differences. The CPU runs it on every SIMD target;
// a CUDA backend is checked with the same rows.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/kiln.hpp"
#include "ops/op_reference.hpp"
#include "support/kernel_harness.hpp"

namespace kiln::test {

/// How a row draws an operand's values.
struct Domain {
  enum class Kind : std::uint8_t {
    uniform,  ///< uniform in [lo, hi), magnitude at least `gap` (off kinks such as relu's)
    tied,     ///< 0, 1 or 2: pooling windows with ties
    distinct, ///< a shuffled grid 0.01 apart: a maximum that a finite-difference probe keeps
    labels,   ///< i32 class labels in [0, classes)
  };
  Kind kind = Kind::uniform;
  float lo = -1.0f, hi = 1.0f, gap = 0.0f;
  std::int32_t classes = 0;
};

inline Domain uniform(float lo, float hi, float gap = 0.0f) {
  return {Domain::Kind::uniform, lo, hi, gap, 0};
}
inline Domain tied() { return {Domain::Kind::tied}; }
inline Domain distinct() { return {Domain::Kind::distinct}; }
inline Domain labels(std::int32_t classes) {
  return {Domain::Kind::labels, 0.0f, 0.0f, 0.0f, classes};
}

/// One operand of a row: its type, its domain, and whether it is a param rather than a graph
/// input (an update's target must be one).
struct Operand {
  TensorType type;
  Domain domain{};
  bool param = false;
};

/// One row: a node of `op` over operands of these types, with these attributes.
struct OpRow {
  Op op = Op::Add;
  std::vector<Operand> operands;
  Attrs attrs = NoAttrs{};
  /// Largest |kernel - reference| allowed, relative to the largest |reference| element.
  double tolerance = 1e-5;
  /// Also check the op's gradient against finite differences on these operands.
  bool gradient = false;
};

/// "conv2d(f32[2,1,6,6], f32[4,1,3,3]) {stride=1x1, pad=0x0}".
inline std::string row_name(const OpRow& row) {
  std::string s = std::string(op_name(row.op)) + "(";
  for (std::size_t i = 0; i < row.operands.size(); ++i)
    s += (i ? ", " : "") + type_text(row.operands[i].type);
  return s + ")" + std::visit([](const auto& a) { return detail::attr_text(a); }, row.attrs);
}

/// The row's output type, from the op's shape inference (throws kiln::Error when the row
/// does not fit the op).
inline TensorType row_output(const OpRow& row) {
  Graph g;
  std::vector<ValueId> ids;
  for (std::size_t i = 0; i < row.operands.size(); ++i) {
    const TensorType& t = row.operands[i].type;
    ids.push_back(
        row.operands[i].param
            ? g.param("p" + std::to_string(i), std::make_shared<Tensor>(t.shape, t.dtype)).id
            : g.input("in" + std::to_string(i), t.shape, t.dtype).id);
  }
  return append(g, row.op, ids, row.attrs).node().type;
}

/// Seeded values of one operand.
inline Values draw(const Operand& operand, std::uint64_t seed) {
  const auto n = static_cast<std::size_t>(operand.type.shape.numel());
  Rng rng(seed);
  Values v;
  const Domain& d = operand.domain;
  if (d.kind == Domain::Kind::labels) {
    for (std::size_t i = 0; i < n; ++i)
      v.i32.push_back(static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(d.classes))));
    return v;
  }
  v.f32.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    float& x = v.f32[i];
    if (d.kind == Domain::Kind::tied) {
      x = static_cast<float>(rng.below(3));
    } else if (d.kind == Domain::Kind::distinct) {
      x = 0.01f * static_cast<float>((i * 37) % n);
    } else {
      do x = rng.uniform(d.lo, d.hi);
      while (std::abs(x) < d.gap);
    }
  }
  if (d.kind == Domain::Kind::distinct)
    for (std::size_t i = n; i > 1; --i) std::swap(v.f32[i - 1], v.f32[rng.below(i)]);
  return v;
}

inline std::vector<Values> draw_all(const OpRow& row, std::uint64_t seed) {
  std::vector<Values> values;
  for (const Operand& o : row.operands) values.push_back(draw(o, seed++));
  return values;
}

namespace detail {
/// The inverse of a permutation.
inline std::vector<int> inverted(std::span<const int> perm) {
  std::vector<int> inv(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i)
    inv[static_cast<std::size_t>(perm[i])] = static_cast<int>(i);
  return inv;
}
} // namespace detail

/// The row's expected output. A node in a channels-last form (a pool or a convolution with its
/// flag set, an average pool with either side NHWC) is checked against the NCHW reference
/// between reorders: its NHWC operands and packed weight are put back to NCHW and OIHW, the
/// reference's result to NHWC.
inline std::vector<float> expected(const OpRow& row, const std::vector<Values>& values,
                                   const TensorType& out) {
  const OpInfo& info = op_info(row.op);
  const ReferenceFn reference = reference_of(row.op);
  REQUIRE(static_cast<bool>(reference));
  const bool channels_last =
      (info.layout == LayoutRule::pool || info.layout == LayoutRule::convolution) &&
      info.channels_last_attrs(row.attrs) == row.attrs;
  std::vector<Values> in = values;
  std::vector<Shape> shapes;
  for (const Operand& o : row.operands) shapes.push_back(o.type.shape);
  Shape out_shape = out.shape;
  bool nhwc_output = false;
  if (channels_last) {
    const ChannelsLastForm& form = info.channels_last_form;
    const bool pool = info.layout == LayoutRule::pool;
    for (std::size_t k = 0; k < in.size(); ++k) {
      std::vector<int> back;
      if (pool ? shapes[k].rank() == 4 : (k < 2 && form.nhwc_inputs[k]))
        back.assign(nhwc_to_nchw.begin(), nhwc_to_nchw.end());
      else if (!pool && form.packed_weight == static_cast<int>(k))
        back = detail::inverted(form.weight_pack);
      if (back.empty()) continue;
      in[k].f32 = ref::transposed(in[k].f32, shapes[k], back);
      shapes[k] = permuted(shapes[k], back);
    }
    nhwc_output = pool || form.nhwc_output;
    if (nhwc_output) out_shape = permuted(out_shape, nhwc_to_nchw);
  } else {
    // Ports whose layout the attributes set one by one (an average pool's two sides).
    for (std::size_t k = 0; k < in.size(); ++k) {
      if (shapes[k].rank() != 4 || !info.port_channels_last(row.attrs, static_cast<int>(k)))
        continue;
      in[k].f32 = ref::transposed(in[k].f32, shapes[k], nhwc_to_nchw);
      shapes[k] = permuted(shapes[k], nhwc_to_nchw);
    }
    nhwc_output = out_shape.rank() == 4 && info.port_channels_last(row.attrs, -1);
    if (nhwc_output) out_shape = permuted(out_shape, nhwc_to_nchw);
  }
  std::vector<float> want = reference(RefCall{in, shapes, out_shape, row.attrs});
  return nhwc_output ? ref::transposed(want, out_shape, nchw_to_nhwc) : want;
}

/// What a row's node computed on a backend, and how it ran.
struct RowRun {
  std::vector<float> out;
  int in_place_of = -1;    ///< the input whose memory the node took over, or -1
  std::string kernel_name; ///< the variant the backend chose; empty for a view
};

/// Compiles the row's node alone on `backend` (every pass off but inplace, so the node is
/// lowered as the row gives it), feeds `values`, runs it once. With `copied` >= 0, that
/// operand reaches the node through a copying kernel, so that its memory dies at the node
/// and the inplace pass may give it to the node's output.
inline RowRun run_row(const Backend& backend, const OpRow& row, const std::vector<Values>& values,
                      int threads, int copied = -1, Precision precision = Precision::f32) {
  Graph g;
  std::vector<ValueId> ids;
  for (std::size_t i = 0; i < row.operands.size(); ++i) {
    const TensorType& t = row.operands[i].type;
    if (row.operands[i].param) {
      auto tensor = std::make_shared<Tensor>(t.shape, t.dtype);
      std::copy(values[i].f32.begin(), values[i].f32.end(), tensor->f32().begin());
      ids.push_back(g.param("p" + std::to_string(i), tensor).id);
      continue;
    }
    Value v = g.input("in" + std::to_string(i), t.shape, t.dtype);
    if (static_cast<int>(i) == copied) v = mul_scalar(v, 1.0f);
    ids.push_back(v.id);
  }
  const Value node = append(g, row.op, ids, row.attrs);
  g.mark_output(node);
  CompileOptions options{.threads = threads, .precision = precision};
  for (const Pass& p : default_pipeline)
    if (p.name != "inplace") options.disable.emplace_back(p.name);
  Executor exe = compile(g, backend, options);
  for (std::size_t i = 0; i < row.operands.size(); ++i) {
    if (row.operands[i].param) continue;
    const std::string name = "in" + std::to_string(i);
    if (row.operands[i].type.dtype == DType::i32)
      exe.set_input(name, std::span<const std::int32_t>(values[i].i32));
    else
      exe.set_input(name, std::span<const float>(values[i].f32));
  }
  exe.run();
  RowRun run;
  const auto out = exe.output(node);
  run.out.assign(out.begin(), out.end());
  run.in_place_of = exe.report().optimised->node(node.id).in_place_of;
  for (const PlanStep& s : exe.plan().steps)
    if (s.node == node.id) run.kernel_name = s.kernel_name;
  return run;
}

/// The operand a row's node may write its output over, by its op's definition: the input it
/// names, or for an op that overwrites any input, the first f32 one of the output's type;
/// -1 when it may not.
inline int overwritable_operand(const OpRow& row, const TensorType& out) {
  const OpInfo& info = op_info(row.op);
  for (std::size_t k = 0; k < row.operands.size(); ++k) {
    const TensorType& t = row.operands[k].type;
    if (row.operands[k].param || t.dtype != out.dtype || t.shape.numel() != out.shape.numel())
      continue;
    if (info.overwrites_any_input ? t == out
                                  : info.overwritable_input(row.attrs) == static_cast<int>(k))
      return static_cast<int>(k);
  }
  return -1;
}

/// An operand the same size and type as the output, which a node could write over if its op
/// allowed it; -1 when there is none.
inline int same_sized_operand(const OpRow& row, const TensorType& out) {
  for (std::size_t k = 0; k < row.operands.size(); ++k) {
    const TensorType& t = row.operands[k].type;
    if (!row.operands[k].param && t.dtype == out.dtype && t.shape.numel() == out.shape.numel())
      return static_cast<int>(k);
  }
  return -1;
}

/// The row's gradient on `backend` against central finite differences (GradCheckOptions'
/// defaults otherwise): every f32 operand is differentiated through loss = sum(node * R), R
/// fixed and random; label operands stay constant.
inline GradCheckResult check_row_gradient(const OpRow& row, std::uint64_t seed,
                                          const Backend& backend = cpu_backend()) {
  const std::vector<Values> values = draw_all(row, seed);
  std::vector<std::shared_ptr<Tensor>> probed, constants;
  for (std::size_t i = 0; i < row.operands.size(); ++i) {
    const TensorType& t = row.operands[i].type;
    auto tensor = std::make_shared<Tensor>(t.shape, t.dtype);
    if (t.dtype == DType::i32)
      std::copy(values[i].i32.begin(), values[i].i32.end(),
                static_cast<std::int32_t*>(tensor->data()));
    else
      std::copy(values[i].f32.begin(), values[i].f32.end(), tensor->f32().begin());
    (t.dtype == DType::f32 ? probed : constants).push_back(tensor);
  }
  return check_gradients(
      [&](Graph& g, const std::vector<Value>& params) {
        std::vector<ValueId> ids;
        std::size_t p = 0, c = 0;
        for (const Operand& o : row.operands) {
          if (o.type.dtype == DType::f32) {
            ids.push_back(params[p++].id);
          } else {
            ids.push_back(g.param("c" + std::to_string(c), constants[c]).id);
            ++c;
          }
        }
        const Value out = append(g, row.op, ids, row.attrs);
        auto weights = std::make_shared<Tensor>(out.shape());
        const Values r = draw(Operand{out.node().type}, seed + 99);
        std::copy(r.f32.begin(), r.f32.end(), weights->f32().begin());
        return sum(out * g.param("R", weights));
      },
      probed, GradCheckOptions{.backend = &backend});
}

} // namespace kiln::test
