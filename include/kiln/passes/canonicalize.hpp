// canonicalize: algebraic simplifications that give equivalent expressions one form.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/ops/effects.hpp"
#include "kiln/ops/registry.hpp"
#include "kiln/passes/pass.hpp"

namespace kiln {

namespace detail {

/// The rule families of canonicalize, each with its own counter in the pass's stats.
enum class CanonicalRule : std::uint8_t {
  identity, ///< x*1, x+0, x-0, x/1, neg(neg x), relu(relu x), same-shape reshape -> x
  scalar,   ///< x op fill c -> x op_scalar c
  combine,  ///< chains of mul_scalar, of add_scalar -> one node
  negation, ///< negations move into scalars and subtractions: a+(-b) -> a-b, (-x)*s -> x*(-s)
  operands, ///< add and mul take the smaller value id first
  reshapes, ///< reshape(reshape x) -> one reshape
};

inline constexpr std::array<const char*, 6> canonical_rule_stat = {
    "identities_removed", "scalars_formed",   "scalars_combined",
    "negations_folded",   "operands_ordered", "reshapes_combined"};

/// Rebuilds a graph node by node in canonical form. New nodes are appended in the order of
/// the nodes they replace, so the rebuilt list stays topologically sorted.
class Canonicalizer {
public:
  explicit Canonicalizer(const Graph& g) : old_overwritten_(overwritten_at(g)) {}

  /// Adds old node `id` (its inputs already renumbered) and returns the value that replaces it.
  ValueId add(ValueId id, Node node) {
    position_ = id;
    if (op_info(node.op).is_source())
      return push(std::move(node), old_overwritten_[static_cast<std::size_t>(id)]);
    return emit(std::move(node));
  }

  [[nodiscard]] std::vector<Node> take_nodes() { return std::move(nodes_); }
  [[nodiscard]] const std::array<std::int64_t, canonical_rule_stat.size()>& counts() const {
    return counts_;
  }

private:
  // A rule never undoes another and each makes an expression shallower or settles an order,
  // so a node reaches its form in a few steps; the cap only guards against a future rule pair
  // that cycles.
  static constexpr int max_steps = 16;

  ValueId emit(Node node) {
    for (int i = 0; i < max_steps; ++i) {
      ValueId replacement = -1;
      if (!step(node, replacement)) break;
      if (replacement >= 0) return replacement;
    }
    const ValueId overwritten = op_info(node.op).is_view
                                    ? overwritten_[static_cast<std::size_t>(node.inputs[0])]
                                    : never_overwritten;
    return push(std::move(node), overwritten);
  }

  ValueId push(Node node, ValueId overwritten) {
    nodes_.push_back(std::move(node));
    overwritten_.push_back(overwritten);
    return static_cast<ValueId>(nodes_.size() - 1);
  }

  [[nodiscard]] const Node& at(ValueId v) const { return nodes_[static_cast<std::size_t>(v)]; }
  [[nodiscard]] TensorType type(ValueId v) const { return at(v).type; }
  [[nodiscard]] std::optional<float> fill(ValueId v) const {
    if (at(v).op != Op::Fill) return std::nullopt;
    return std::get<FillAttrs>(at(v).attrs).value;
  }
  static float scalar(const Node& n) { return std::get<ScalarAttrs>(n.attrs).value; }

  /// A node at the current position may read `v` if nothing (an assign, a fused store)
  /// overwrites v's storage before it: the node it replaces may have read v earlier, before
  /// the write.
  [[nodiscard]] bool readable(ValueId v) const {
    return position_ < overwritten_[static_cast<std::size_t>(v)];
  }

  void count(CanonicalRule rule) { ++counts_[static_cast<std::size_t>(rule)]; }

  /// Replaces the node by the existing value `v` when that keeps the type, and when every
  /// later reader sees the same contents in v (its storage is never overwritten).
  bool becomes(ValueId v, const Node& node, ValueId& replacement, CanonicalRule rule) {
    if (!(type(v) == node.type) || overwritten_[static_cast<std::size_t>(v)] != never_overwritten)
      return false;
    replacement = v;
    count(rule);
    return true;
  }

  /// Turns the node into op(inputs) with the same type, if the values it newly reads may be
  /// read here.
  bool rewrite(Node& node, Op op, std::vector<ValueId> inputs, Attrs attrs, CanonicalRule rule) {
    for (ValueId v : inputs)
      if (std::find(node.inputs.begin(), node.inputs.end(), v) == node.inputs.end() && !readable(v))
        return false;
    node.op = op;
    node.inputs = std::move(inputs);
    node.attrs = std::move(attrs);
    count(rule);
    return true;
  }

  /// Applies the first rule that matches; false when none does.
  bool step(Node& node, ValueId& replacement) {
    using R = CanonicalRule;
    const auto in = [&](std::size_t i) { return node.inputs[i]; };
    switch (node.op) {
    case Op::MulScalar: {
      const float s = scalar(node);
      const Node p = at(in(0));
      if (s == 1.0f && becomes(in(0), node, replacement, R::identity)) return true;
      if (s == -1.0f) return rewrite(node, Op::Neg, {in(0)}, NoAttrs{}, R::negation);
      // Only when the one factor neither overflows, underflows nor is zero: the two steps
      // might not (e.g. (x*a)*0 is NaN where x*a overflowed).
      if (p.op == Op::MulScalar) {
        const float f = scalar(p) * s;
        if (std::isnormal(f))
          return rewrite(node, Op::MulScalar, {p.inputs[0]}, ScalarAttrs{f}, R::combine);
      }
      if (p.op == Op::Neg)
        return rewrite(node, Op::MulScalar, {p.inputs[0]}, ScalarAttrs{-s}, R::negation);
      return false;
    }
    case Op::AddScalar: {
      const float s = scalar(node);
      const Node p = at(in(0));
      if (s == 0.0f && becomes(in(0), node, replacement, R::identity)) return true;
      if (p.op == Op::AddScalar && std::isfinite(scalar(p) + s))
        return rewrite(node, Op::AddScalar, {p.inputs[0]}, ScalarAttrs{scalar(p) + s}, R::combine);
      return false;
    }
    case Op::Neg: {
      const Node p = at(in(0));
      if (p.op == Op::Neg && becomes(p.inputs[0], node, replacement, R::identity)) return true;
      if (p.op == Op::MulScalar)
        return rewrite(node, Op::MulScalar, {p.inputs[0]}, ScalarAttrs{-scalar(p)}, R::negation);
      return false;
    }
    case Op::Relu: {
      // relu is idempotent: relu(relu x) is the inner relu.
      return at(in(0)).op == Op::Relu && becomes(in(0), node, replacement, R::identity);
    }
    case Op::Reshape:
    case Op::BroadcastTo: {
      if (becomes(in(0), node, replacement, R::identity)) return true;
      const Node p = at(in(0));
      if (node.op == Op::Reshape && p.op == Op::Reshape)
        return rewrite(node, Op::Reshape, {p.inputs[0]}, node.attrs, R::reshapes);
      return false;
    }
    case Op::Add:
    case Op::Mul: {
      const bool is_add = node.op == Op::Add;
      const float unit = is_add ? 0.0f : 1.0f;
      for (std::size_t side = 0; side < 2; ++side) {
        const ValueId x = in(1 - side);
        const std::optional<float> c = fill(in(side));
        if (!c || !(type(x) == node.type)) continue;
        if (*c == unit && becomes(x, node, replacement, R::identity)) return true;
        if (rewrite(node, is_add ? Op::AddScalar : Op::MulScalar, {x}, ScalarAttrs{*c}, R::scalar))
          return true;
      }
      if (is_add)
        for (std::size_t side = 0; side < 2; ++side)
          if (const Node p = at(in(side));
              p.op == Op::Neg &&
              rewrite(node, Op::Sub, {in(1 - side), p.inputs[0]}, NoAttrs{}, R::negation))
            return true;
      if (in(0) > in(1)) {
        std::swap(node.inputs[0], node.inputs[1]);
        count(R::operands);
        return true;
      }
      return false;
    }
    case Op::Sub: {
      const ValueId a = in(0), b = in(1);
      if (const std::optional<float> c = fill(b); c && type(a) == node.type) {
        if (*c == 0.0f && becomes(a, node, replacement, R::identity)) return true;
        if (rewrite(node, Op::AddScalar, {a}, ScalarAttrs{-*c}, R::scalar)) return true;
      }
      // c - x = (-x) + c exactly, and -x is shared with every other negation of x. The
      // negation reads b where the node did.
      if (const std::optional<float> c = fill(a); c && type(b) == node.type) {
        const TensorType negated_type = type(b);
        const ValueId negated = emit(Node{Op::Neg, {b}, NoAttrs{}, negated_type});
        node.op = Op::AddScalar;
        node.inputs = {negated};
        node.attrs = ScalarAttrs{*c};
        count(R::scalar);
        return true;
      }
      if (const Node p = at(b); p.op == Op::Neg)
        return rewrite(node, Op::Add, {a, p.inputs[0]}, NoAttrs{}, R::negation);
      return false;
    }
    case Op::Div: {
      const std::optional<float> c = fill(in(1));
      return c && *c == 1.0f && becomes(in(0), node, replacement, R::identity);
    }
    default:
      return false;
    }
  }

  std::vector<ValueId> old_overwritten_;
  std::vector<Node> nodes_;
  std::vector<ValueId> overwritten_;
  ValueId position_ = 0;
  std::array<std::int64_t, canonical_rule_stat.size()> counts_{};
};

} // namespace detail

/// Rewrites equivalent expressions into one form, so that CSE merges them and fusion sees
/// them alike. Every rule keeps each node's type and is exact in IEEE arithmetic except
/// where noted:
///   identities: x*1, 1*x, x+0, 0+x, x-0, x/1 (with fills that broadcast to x's shape),
///     mul_scalar(x, 1), add_scalar(x, 0), neg(neg x), relu(relu x), reshape or broadcast_to
///     to x's own shape -> x (x+0 turns -0 into +0: the sign of a zero may change);
///   scalars: x*fill c, fill c*x -> mul_scalar(x, c); x+fill c -> add_scalar(x, c);
///     x-fill c -> add_scalar(x, -c); fill c-x -> add_scalar(neg x, c);
///   combining: mul_scalar(mul_scalar(x, a), b) -> mul_scalar(x, a*b) and likewise
///     add_scalar (a*b, a+b rounded once: not bit-exact; skipped when a+b overflows or a*b
///     is not a normal number); reshape(reshape x) -> reshape x;
///   negations: mul_scalar(x, -1) -> neg x; mul_scalar(neg x, s), neg(mul_scalar(x, s))
///     -> mul_scalar(x, -s); a+neg b, neg b+a -> a-b; a-neg b -> a+b;
///   operand order: add and mul read the smaller value id first.
/// Replacements are inserted where the node they replace was; the nodes they no longer read
/// are left for dead-node elimination. A rewrite never moves a read of a param (or a view of
/// it) across the param's assign, nor replaces a value by such a param.
inline PassResult canonicalize(Graph& g, PassContext&) {
  detail::Canonicalizer c(g);
  std::vector<ValueId> remap(static_cast<std::size_t>(g.size()));
  for (ValueId id = 0; id < g.size(); ++id) {
    Node node = g.node(id);
    for (ValueId& in : node.inputs) in = remap[static_cast<std::size_t>(in)];
    remap[static_cast<std::size_t>(id)] = c.add(id, std::move(node));
  }
  PassResult r;
  for (std::size_t i = 0; i < detail::canonical_rule_stat.size(); ++i)
    r.count(detail::canonical_rule_stat[i], c.counts()[i]);
  if (r.changed) {
    std::vector<ValueId> outputs;
    for (ValueId o : g.outputs()) outputs.push_back(remap[static_cast<std::size_t>(o)]);
    g.reset(c.take_nodes(), std::move(outputs));
  }
  return r;
}

} // namespace kiln
