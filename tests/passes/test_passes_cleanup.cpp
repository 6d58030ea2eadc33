// Cleanup pass tests: common-subexpression elimination, constant folding and canonicalisation,
// each as IR text before and after, and as outputs computed with and without the pass.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/kiln.hpp"

#include "kiln/passes/canonicalize.hpp"
#include "kiln/passes/eliminate_common_subexpressions.hpp"
#include "kiln/passes/eliminate_dead_nodes.hpp"
#include "kiln/passes/fold_constants.hpp"
#include "support/graph_test_helpers.hpp"

namespace {

using kiln::test::random_tensor;

using kiln::Shape;
using kiln::Value;

using Stats = std::vector<std::pair<std::string, std::int64_t>>;

/// Runs `passes` in order and checks that the graph is still well formed.
void run(kiln::Graph& g, std::initializer_list<kiln::PassFn> passes) {
  kiln::PassContext ctx;
  for (kiln::PassFn pass : passes) (void)pass(g, ctx);
  kiln::verify(g);
}

/// Nodes that compute something: neither inputs, params nor fills.
int computing_nodes(const kiln::Graph& g) {
  int n = 0;
  for (const kiln::Node& node : g.nodes())
    n += node.op != kiln::Op::Input && node.op != kiln::Op::Param && node.op != kiln::Op::Fill;
  return n;
}

/// Every output of `g` (in output order) after each of `runs` runs, with every input fed the
/// same values whatever the graph: seeded by the input's name, labels below their class count.
/// Params are restored afterwards, so graphs sharing them can be run one after the other.
std::vector<std::vector<float>> outputs_of(const kiln::Graph& g, int runs = 1) {
  std::vector<std::pair<std::shared_ptr<kiln::Tensor>, std::vector<float>>> saved;
  for (const kiln::Node& node : g.nodes())
    if (const auto* p = std::get_if<kiln::ParamAttrs>(&node.attrs))
      saved.emplace_back(p->tensor,
                         std::vector<float>(p->tensor->f32().begin(), p->tensor->f32().end()));
  // Once the default pipeline runs the cleanup passes, "without the pass" must still mean
  // without them.
  kiln::CompileOptions options{.threads = 1};
  for (const kiln::Pass& pass : kiln::default_pipeline)
    if (pass.name == "cse" || pass.name == "fold" || pass.name == "canonicalize")
      options.disable.emplace_back(pass.name);
  kiln::Executor exe = kiln::compile(g, options);
  for (const kiln::Node& node : g.nodes()) {
    const auto* in = std::get_if<kiln::InputAttrs>(&node.attrs);
    if (!in) continue;
    kiln::Rng rng(std::hash<std::string>{}(in->name));
    const auto count = static_cast<std::size_t>(node.type.shape.numel());
    if (node.type.dtype == kiln::i32) {
      std::vector<std::int32_t> labels(count);
      for (auto& l : labels)
        l = static_cast<std::int32_t>(
            rng.below(in->label_classes > 0 ? static_cast<std::uint64_t>(in->label_classes) : 2));
      exe.set_input(in->name, labels);
    } else {
      std::vector<float> values(count);
      for (float& v : values) v = rng.uniform(-2.0f, 2.0f);
      exe.set_input(in->name, values);
    }
  }
  std::vector<std::vector<float>> out;
  for (int r = 0; r < runs; ++r) {
    exe.run();
    for (kiln::ValueId o : g.outputs()) {
      const auto v = exe.output(o);
      out.emplace_back(v.begin(), v.end());
    }
  }
  // The updated params are results too.
  for (auto& [tensor, before] : saved) {
    out.emplace_back(tensor->f32().begin(), tensor->f32().end());
    std::copy(before.begin(), before.end(), tensor->f32().begin());
  }
  return out;
}

void check_close(const std::vector<std::vector<float>>& expected,
                 const std::vector<std::vector<float>>& actual, double epsilon = 1e-5) {
  REQUIRE(expected.size() == actual.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(i);
    REQUIRE(expected[i].size() == actual[i].size());
    for (std::size_t j = 0; j < expected[i].size(); ++j) {
      if (actual[i][j] == expected[i][j]) continue; // also equal infinities, which Approx rejects
      CHECK(actual[i][j] == doctest::Approx(expected[i][j]).epsilon(epsilon));
    }
  }
}

/// The graph computes the same after `passes` as before (run on a copy: params are shared).
void check_same_outputs(const kiln::Graph& g, std::initializer_list<kiln::PassFn> passes,
                        int runs = 1, double epsilon = 1e-5) {
  const auto expected = outputs_of(g, runs);
  auto copy = g.clone();
  run(*copy, passes);
  check_close(expected, outputs_of(*copy, runs), epsilon);
}

} // namespace

// ---------------------------------------------------------------------------------------------
// eliminate_common_subexpressions

TEST_CASE("cse: equal nodes merge, commutative operands in either order, uses follow") {
  kiln::Graph g;
  auto x = g.input("x", {2, 3});
  auto y = g.input("y", {2, 3});
  auto s1 = x + y;
  auto s2 = y + x;
  auto twice1 = kiln::mul_scalar(s1, 2.0f);
  auto twice2 = kiln::mul_scalar(s2, 2.0f); // equal to twice1 once s2 is s1
  auto thrice = kiln::mul_scalar(s1, 3.0f); // a different scalar: stays
  auto one_a = kiln::fill(g, {3}, 1.0f);
  auto one_b = kiln::fill(g, {3}, 1.0f);
  g.mark_output((twice2 - thrice) * one_b + one_a);
  g.mark_output(twice1);
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3]\n"
                            "%1 = input \"y\" : f32[2,3]\n"
                            "%2 = add(%0, %1) : f32[2,3]\n"
                            "%3 = add(%1, %0) : f32[2,3]\n"
                            "%4 = mul_scalar(%2) {value=2} : f32[2,3]\n"
                            "%5 = mul_scalar(%3) {value=2} : f32[2,3]\n"
                            "%6 = mul_scalar(%2) {value=3} : f32[2,3]\n"
                            "%7 = fill {value=1, shape=[3]} : f32[3]\n"
                            "%8 = fill {value=1, shape=[3]} : f32[3]\n"
                            "%9 = sub(%5, %6) : f32[2,3]\n"
                            "%10 = mul(%9, %8) : f32[2,3]\n"
                            "%11 = add(%10, %7) : f32[2,3]\n"
                            "outputs: %11 %4\n");
  check_same_outputs(g, {kiln::eliminate_common_subexpressions});

  kiln::PassContext ctx;
  const kiln::PassResult r = kiln::eliminate_common_subexpressions(g, ctx);
  CHECK(r.changed);
  CHECK(r.stats == Stats{{"nodes_merged", 3}});
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3]\n"
                            "%1 = input \"y\" : f32[2,3]\n"
                            "%2 = add(%0, %1) : f32[2,3]\n"
                            "%3 = mul_scalar(%2) {value=2} : f32[2,3]\n"
                            "%4 = mul_scalar(%2) {value=3} : f32[2,3]\n"
                            "%5 = fill {value=1, shape=[3]} : f32[3]\n"
                            "%6 = sub(%3, %4) : f32[2,3]\n"
                            "%7 = mul(%6, %5) : f32[2,3]\n"
                            "%8 = add(%7, %5) : f32[2,3]\n"
                            "outputs: %8 %3\n");
  kiln::verify(g);

  const kiln::PassResult again = kiln::eliminate_common_subexpressions(g, ctx);
  CHECK(!again.changed);
  CHECK(again.stats == Stats{{"nodes_merged", 0}});
}

TEST_CASE("cse: sources, assigns, operand order of sub and different attributes stay apart") {
  kiln::Graph g;
  auto x = g.input("x", {4});
  auto y = g.input("y", {4}); // same type as x, but another value
  auto p = g.param("p", random_tensor({4}, 1));
  auto q = g.param("q", random_tensor({4}, 2)); // same shape as p, another tensor
  auto d1 = x - y;
  auto d2 = y - x;
  auto m1 = kiln::dropout_mask(g, {4}, 0.5f, 7);
  auto m2 = kiln::dropout_mask(g, {4}, 0.5f, 7); // deterministic: the same mask as m1
  auto m3 = kiln::dropout_mask(g, {4}, 0.5f, 8);
  auto zero = kiln::fill(g, {4}, 0.0f);
  auto negative_zero = kiln::fill(g, {4}, -0.0f); // equal attrs: 0 == -0, and the sums agree
  auto two = kiln::fill(g, {4}, 2.0f);
  auto new_p = kiln::assign(p, d1 * m1 + zero);
  auto new_q = kiln::assign(q, d2 * m2 * m3 + negative_zero + two);
  g.mark_output(new_p + new_q);
  check_same_outputs(g, {kiln::eliminate_common_subexpressions});

  kiln::PassContext ctx;
  const kiln::PassResult r = kiln::eliminate_common_subexpressions(g, ctx);
  CHECK(r.stats == Stats{{"nodes_merged", 2}});
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[4]\n"
                            "%1 = input \"y\" : f32[4]\n"
                            "%2 = param \"p\" : f32[4]\n"
                            "%3 = param \"q\" : f32[4]\n"
                            "%4 = sub(%0, %1) : f32[4]\n"
                            "%5 = sub(%1, %0) : f32[4]\n"
                            "%6 = dropout_mask {p=0.5, seed=7} : f32[4]\n"
                            "%7 = dropout_mask {p=0.5, seed=8} : f32[4]\n"
                            "%8 = fill {value=0, shape=[4]} : f32[4]\n"
                            "%9 = fill {value=2, shape=[4]} : f32[4]\n"
                            "%10 = mul(%4, %6) : f32[4]\n"
                            "%11 = add(%10, %8) : f32[4]\n"
                            "%12 = assign(%2, %11) : f32[4]\n"
                            "%13 = mul(%5, %6) : f32[4]\n"
                            "%14 = mul(%13, %7) : f32[4]\n"
                            "%15 = add(%14, %8) : f32[4]\n"
                            "%16 = add(%15, %9) : f32[4]\n"
                            "%17 = assign(%3, %16) : f32[4]\n"
                            "%18 = add(%12, %17) : f32[4]\n"
                            "outputs: %18\n");
}

TEST_CASE("cse: a read through a view after the param's assign is not the read before it") {
  // r views p's storage: exp(r) before the assign reads the old p, after it the new one.
  kiln::Graph g;
  auto x = g.input("x", {2, 3});
  auto p = g.param("p", random_tensor({2, 3}, 3));
  auto r = kiln::reshape(p, {6});
  auto before = kiln::exp(r);
  auto before_again = kiln::exp(r);
  kiln::assign(p, x);
  auto after = kiln::exp(r);
  g.mark_output(before);
  g.mark_output(before_again);
  g.mark_output(after);
  check_same_outputs(g, {kiln::eliminate_common_subexpressions});

  kiln::PassContext ctx;
  CHECK(kiln::eliminate_common_subexpressions(g, ctx).stats == Stats{{"nodes_merged", 1}});
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3]\n"
                            "%1 = param \"p\" : f32[2,3]\n"
                            "%2 = reshape(%1) {shape=[6]} : f32[6]\n"
                            "%3 = exp(%2) : f32[6]\n"
                            "%4 = assign(%1, %0) : f32[2,3]\n"
                            "%5 = exp(%2) : f32[6]\n"
                            "outputs: %3 %3 %5\n");
}

// ---------------------------------------------------------------------------------------------
// fold_constants

TEST_CASE("fold: the seed gradient through reshape and broadcast_to, elementwise ops, sum_to") {
  kiln::Graph g;
  auto x = g.input("x", {2, 3});
  auto seed = kiln::fill(g, {}, 1.0f);
  auto grad = kiln::broadcast_to(kiln::reshape(seed, {1, 1}), {2, 3});
  auto dx = kiln::relu_grad(x, grad); // reads x: stays
  auto one = kiln::fill(g, {3}, 1.0f);
  auto two = kiln::fill(g, {2, 3}, 2.0f);
  auto c = kiln::mul_scalar(one + two, 0.5f);
  auto s = kiln::sum_to(c, {1, 3});
  g.mark_output(dx + s);
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3]\n"
                            "%1 = fill {value=1, shape=[]} : f32[]\n"
                            "%2 = reshape(%1) {shape=[1,1]} : f32[1,1]\n"
                            "%3 = broadcast_to(%2) {shape=[2,3]} : f32[2,3]\n"
                            "%4 = relu_grad(%0, %3) : f32[2,3]\n"
                            "%5 = fill {value=1, shape=[3]} : f32[3]\n"
                            "%6 = fill {value=2, shape=[2,3]} : f32[2,3]\n"
                            "%7 = add(%5, %6) : f32[2,3]\n"
                            "%8 = mul_scalar(%7) {value=0.5} : f32[2,3]\n"
                            "%9 = sum_to(%8) {shape=[1,3]} : f32[1,3]\n"
                            "%10 = add(%4, %9) : f32[2,3]\n"
                            "outputs: %10\n");
  check_same_outputs(g, {kiln::fold_constants});
  check_same_outputs(g, {kiln::fold_constants, kiln::eliminate_dead_nodes});

  kiln::PassContext ctx;
  const kiln::PassResult r = kiln::fold_constants(g, ctx);
  CHECK(r.changed);
  CHECK(r.stats == Stats{{"nodes_folded", 5}});
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3]\n"
                            "%1 = fill {value=1, shape=[]} : f32[]\n"
                            "%2 = fill {value=1, shape=[1,1]} : f32[1,1]\n"
                            "%3 = fill {value=1, shape=[2,3]} : f32[2,3]\n"
                            "%4 = relu_grad(%0, %3) : f32[2,3]\n"
                            "%5 = fill {value=1, shape=[3]} : f32[3]\n"
                            "%6 = fill {value=2, shape=[2,3]} : f32[2,3]\n"
                            "%7 = fill {value=3, shape=[2,3]} : f32[2,3]\n"
                            "%8 = fill {value=1.5, shape=[2,3]} : f32[2,3]\n"
                            "%9 = fill {value=3, shape=[1,3]} : f32[1,3]\n"
                            "%10 = add(%4, %9) : f32[2,3]\n"
                            "outputs: %10\n");
  kiln::verify(g);
  (void)kiln::eliminate_dead_nodes(g, ctx);
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3]\n"
                            "%1 = fill {value=1, shape=[2,3]} : f32[2,3]\n"
                            "%2 = relu_grad(%0, %1) : f32[2,3]\n"
                            "%3 = fill {value=3, shape=[1,3]} : f32[1,3]\n"
                            "%4 = add(%2, %3) : f32[2,3]\n"
                            "outputs: %4\n");
  CHECK(!kiln::fold_constants(g, ctx).changed);
}

TEST_CASE("fold: every elementwise op folds to what its kernel computes") {
  int folded_ops = 0;
  for (std::size_t index = 0; index < kiln::op_count; ++index) {
    const auto op = static_cast<kiln::Op>(index);
    const kiln::OpInfo& info = kiln::op_info(op);
    if (!info.is_elementwise) continue;
    CAPTURE(info.name);
    kiln::Graph g;
    // Positive values keep log, sqrt and rsqrt defined; relu_grad takes equal shapes.
    const Shape second = op == kiln::Op::ReluGrad ? Shape{2, 3} : Shape{3};
    const bool full_first =
        (info.arity == 1 && op != kiln::Op::BroadcastTo) || op == kiln::Op::ReluGrad;
    auto a = kiln::fill(g, full_first ? Shape{2, 3} : Shape{3}, 0.7f);
    auto b = kiln::fill(g, second, 1.3f);
    kiln::Attrs attrs = kiln::NoAttrs{};
    if (op == kiln::Op::MulScalar || op == kiln::Op::AddScalar) attrs = kiln::ScalarAttrs{-2.5f};
    if (op == kiln::Op::BroadcastTo) attrs = kiln::ShapeAttrs{{2, 3}};
    std::vector<kiln::ValueId> inputs{a.id};
    if (info.arity == 2) inputs.push_back(b.id);
    g.mark_output(kiln::append(g, op, inputs, attrs));
    check_same_outputs(g, {kiln::fold_constants});
    auto copy = g.clone();
    kiln::PassContext ctx;
    CHECK(kiln::fold_constants(*copy, ctx).stats == Stats{{"nodes_folded", 1}});
    CHECK(copy->node(copy->outputs()[0]).op == kiln::Op::Fill);
    ++folded_ops;
  }
  CHECK(folded_ops >= 15);
}

// ---------------------------------------------------------------------------------------------
// canonicalize

TEST_CASE("canonicalize: identities disappear") {
  kiln::Graph g;
  auto x = g.input("x", {2, 3});
  auto a = x * kiln::fill(g, {3}, 1.0f);
  auto b = kiln::fill(g, {}, 0.0f) + a;
  auto c = kiln::add_scalar(kiln::mul_scalar(b, 1.0f), 0.0f);
  auto d = kiln::neg(kiln::neg(c));
  auto e = kiln::relu(kiln::relu(d));
  g.mark_output(e);
  check_same_outputs(g, {kiln::canonicalize});

  kiln::PassContext ctx;
  const kiln::PassResult r = kiln::canonicalize(g, ctx);
  CHECK(r.stats == Stats{{"identities_removed", 6},
                         {"scalars_formed", 0},
                         {"scalars_combined", 0},
                         {"negations_folded", 0},
                         {"operands_ordered", 0},
                         {"reshapes_combined", 0}});
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3]\n"
                            "%1 = fill {value=1, shape=[3]} : f32[3]\n"
                            "%2 = fill {value=0, shape=[]} : f32[]\n"
                            "%3 = neg(%0) : f32[2,3]\n"
                            "%4 = relu(%0) : f32[2,3]\n"
                            "outputs: %4\n");
  (void)kiln::eliminate_dead_nodes(g, ctx);
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3]\n"
                            "%1 = relu(%0) : f32[2,3]\n"
                            "outputs: %1\n");
  CHECK(!kiln::canonicalize(g, ctx).changed);
}

TEST_CASE("canonicalize: an identity that would change the type stays") {
  // x * fill(1) with a larger fill broadcasts x: the result is not x.
  kiln::Graph g;
  auto x = g.input("x", {3});
  g.mark_output(x * kiln::fill(g, {2, 3}, 1.0f));
  g.mark_output(x - kiln::fill(g, {2, 3}, 4.0f));
  const std::string before = kiln::to_text(g);
  kiln::PassContext ctx;
  CHECK(!kiln::canonicalize(g, ctx).changed);
  CHECK(kiln::to_text(g) == before);
}

TEST_CASE("canonicalize: reshape chains, division by one, one-constant overflow") {
  kiln::Graph g;
  auto x = g.input("x", {2, 3});
  auto flat = kiln::reshape(x, {6});
  auto one = kiln::fill(g, {}, 1.0f);
  g.mark_output(kiln::reshape(flat, {3, 2}) / one);
  // 1e30 * 1e30 overflows, 1e-30 * 1e-30 underflows: x*a*b can still be finite and nonzero.
  g.mark_output(kiln::mul_scalar(kiln::mul_scalar(x, 1e30f), 1e30f));
  g.mark_output(kiln::mul_scalar(kiln::mul_scalar(x, 1e-30f), 1e-30f));
  g.mark_output(kiln::add_scalar(kiln::add_scalar(x, 3e38f), 3e38f));
  check_same_outputs(g, {kiln::canonicalize});

  kiln::PassContext ctx;
  CHECK(kiln::canonicalize(g, ctx).stats == Stats{{"identities_removed", 1},
                                                  {"scalars_formed", 0},
                                                  {"scalars_combined", 0},
                                                  {"negations_folded", 0},
                                                  {"operands_ordered", 0},
                                                  {"reshapes_combined", 1}});
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3]\n"
                            "%1 = reshape(%0) {shape=[6]} : f32[6]\n"
                            "%2 = fill {value=1, shape=[]} : f32[]\n"
                            "%3 = reshape(%0) {shape=[3,2]} : f32[3,2]\n"
                            "%4 = mul_scalar(%0) {value=1e+30} : f32[2,3]\n"
                            "%5 = mul_scalar(%4) {value=1e+30} : f32[2,3]\n"
                            "%6 = mul_scalar(%0) {value=1e-30} : f32[2,3]\n"
                            "%7 = mul_scalar(%6) {value=1e-30} : f32[2,3]\n"
                            "%8 = add_scalar(%0) {value=3e+38} : f32[2,3]\n"
                            "%9 = add_scalar(%8) {value=3e+38} : f32[2,3]\n"
                            "outputs: %3 %5 %7 %9\n");
}

TEST_CASE("canonicalize: fills become scalars and scalar chains combine") {
  kiln::Graph g;
  auto x = g.input("x", {2, 3});
  auto a = kiln::fill(g, {1, 3}, 2.0f) * x;
  auto b = kiln::mul_scalar(a, 3.0f);
  auto c = kiln::add_scalar(b - kiln::fill(g, {}, 0.5f), 1.5f);
  g.mark_output(kiln::fill(g, {}, 1.0f) - c);
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3]\n"
                            "%1 = fill {value=2, shape=[1,3]} : f32[1,3]\n"
                            "%2 = mul(%1, %0) : f32[2,3]\n"
                            "%3 = mul_scalar(%2) {value=3} : f32[2,3]\n"
                            "%4 = fill {value=0.5, shape=[]} : f32[]\n"
                            "%5 = sub(%3, %4) : f32[2,3]\n"
                            "%6 = add_scalar(%5) {value=1.5} : f32[2,3]\n"
                            "%7 = fill {value=1, shape=[]} : f32[]\n"
                            "%8 = sub(%7, %6) : f32[2,3]\n"
                            "outputs: %8\n");
  check_same_outputs(g, {kiln::canonicalize});

  kiln::PassContext ctx;
  const kiln::PassResult r = kiln::canonicalize(g, ctx);
  CHECK(r.stats == Stats{{"identities_removed", 0},
                         {"scalars_formed", 3},
                         {"scalars_combined", 2},
                         {"negations_folded", 0},
                         {"operands_ordered", 0},
                         {"reshapes_combined", 0}});
  // 1 - c became (-c) + 1: the same form as kiln::add_scalar(kiln::neg(c), 1).
  CHECK(kiln::to_text(g) == "%0 = input \"x\" : f32[2,3]\n"
                            "%1 = fill {value=2, shape=[1,3]} : f32[1,3]\n"
                            "%2 = mul_scalar(%0) {value=2} : f32[2,3]\n"
                            "%3 = mul_scalar(%0) {value=6} : f32[2,3]\n"
                            "%4 = fill {value=0.5, shape=[]} : f32[]\n"
                            "%5 = add_scalar(%3) {value=-0.5} : f32[2,3]\n"
                            "%6 = add_scalar(%3) {value=1} : f32[2,3]\n"
                            "%7 = fill {value=1, shape=[]} : f32[]\n"
                            "%8 = neg(%6) : f32[2,3]\n"
                            "%9 = add_scalar(%8) {value=1} : f32[2,3]\n"
                            "outputs: %9\n");
  kiln::verify(g);
}

TEST_CASE("canonicalize: negations fold into subtractions and scalars, and add and mul order their "
          "operands") {
  kiln::Graph g;
  auto a = g.input("a", {2, 3});
  auto b = g.input("b", {2, 3});
  auto nb = kiln::neg(b);
  auto sum = a - nb;
  auto difference = nb + a;
  auto scaled = kiln::mul_scalar(nb, 3.0f);
  auto negated = kiln::mul_scalar(a, -1.0f);
  g.mark_output(negated);
  g.mark_output(scaled * sum);
  g.mark_output(difference + sum);
  check_same_outputs(g, {kiln::canonicalize});

  kiln::PassContext ctx;
  const kiln::PassResult r = kiln::canonicalize(g, ctx);
  CHECK(r.stats == Stats{{"identities_removed", 0},
                         {"scalars_formed", 0},
                         {"scalars_combined", 0},
                         {"negations_folded", 4},
                         {"operands_ordered", 2},
                         {"reshapes_combined", 0}});
  CHECK(kiln::to_text(g) == "%0 = input \"a\" : f32[2,3]\n"
                            "%1 = input \"b\" : f32[2,3]\n"
                            "%2 = neg(%1) : f32[2,3]\n"
                            "%3 = add(%0, %1) : f32[2,3]\n"
                            "%4 = sub(%0, %1) : f32[2,3]\n"
                            "%5 = mul_scalar(%1) {value=-3} : f32[2,3]\n"
                            "%6 = neg(%0) : f32[2,3]\n"
                            "%7 = mul(%3, %5) : f32[2,3]\n"
                            "%8 = add(%3, %4) : f32[2,3]\n"
                            "outputs: %6 %7 %8\n");
}

TEST_CASE("canonicalize then cse: a+b and b+a, x*2*3 and x*6, 1-w spelled two ways") {
  kiln::Graph g;
  auto a = g.input("a", {2, 3});
  auto b = g.input("b", {2, 3});
  auto w = g.param("w", random_tensor({2, 3}, 4));
  g.mark_output(a + b);
  g.mark_output(b + a);
  g.mark_output(kiln::mul_scalar(kiln::mul_scalar(a, 2.0f), 3.0f));
  g.mark_output(kiln::mul_scalar(a, 6.0f));
  g.mark_output(kiln::fill(g, {}, 1.0f) - w);
  g.mark_output(kiln::add_scalar(kiln::neg(w), 1.0f));
  check_same_outputs(
      g, {kiln::canonicalize, kiln::eliminate_common_subexpressions, kiln::eliminate_dead_nodes});
  run(g, {kiln::canonicalize, kiln::eliminate_common_subexpressions, kiln::eliminate_dead_nodes});
  CHECK(kiln::to_text(g) == "%0 = input \"a\" : f32[2,3]\n"
                            "%1 = input \"b\" : f32[2,3]\n"
                            "%2 = param \"w\" : f32[2,3]\n"
                            "%3 = add(%0, %1) : f32[2,3]\n"
                            "%4 = mul_scalar(%0) {value=6} : f32[2,3]\n"
                            "%5 = neg(%2) : f32[2,3]\n"
                            "%6 = add_scalar(%5) {value=1} : f32[2,3]\n"
                            "outputs: %3 %3 %4 %4 %6 %6\n");
}

TEST_CASE("canonicalize: no rewrite moves a read of a param's storage across its assign") {
  // r views p. m = r*1 copies the old p before the assign and is read after it; replacing m by
  // r would read the new p. Likewise folding the chain of scalars into one node placed after
  // the assign would read r there.
  kiln::Graph g;
  auto x = g.input("x", {2, 3});
  auto p = g.param("p", random_tensor({2, 3}, 5));
  auto r = kiln::reshape(p, {6});
  auto copy = kiln::mul_scalar(r, 1.0f);
  auto scaled = kiln::mul_scalar(r, 2.0f);
  kiln::assign(p, x);
  g.mark_output(kiln::exp(copy));
  g.mark_output(kiln::mul_scalar(scaled, 3.0f));
  g.mark_output(copy);
  const std::string before = kiln::to_text(g);
  check_same_outputs(
      g, {kiln::canonicalize, kiln::eliminate_common_subexpressions, kiln::eliminate_dead_nodes});
  kiln::PassContext ctx;
  CHECK(!kiln::canonicalize(g, ctx).changed);
  CHECK(kiln::to_text(g) == before);
}

TEST_CASE("canonicalize, cse and dead-node elimination on the two spellings of a lerp") {
  // a + (b-a)*w and a*(1-w) + b*w are equal over the reals, but no exact local rule turns one
  // into the other: it takes factoring a*(1-w) + b*w = a + (b-a)*w, which rounds differently
  // (below: 0 against 1). So the passes make the two spellings of 1-w one graph, and keep
  // the factored and the expanded lerp apart.
  enum Form { factored, expanded_scalar, expanded_fill };
  const auto build = [](kiln::Graph& g, Form form) {
    auto a = g.input("a", {2, 3});
    auto b = g.input("b", {2, 3});
    auto w = g.param("w", std::make_shared<kiln::Tensor>(Shape{2, 3}));
    if (form == factored) {
      g.mark_output(a + (b - a) * w);
      return;
    }
    // One statement per node: the operands of an overloaded + are built in no fixed order.
    auto one_minus_w = form == expanded_scalar ? kiln::add_scalar(kiln::neg(w), 1.0f)
                                               : kiln::fill(g, {}, 1.0f) - w;
    auto left = a * one_minus_w;
    auto right = b * w;
    g.mark_output(left + right);
  };
  std::vector<std::string> texts;
  std::vector<int> counts;
  for (Form form : {factored, expanded_scalar, expanded_fill}) {
    CAPTURE(static_cast<int>(form));
    kiln::Graph g;
    build(g, form);
    check_same_outputs(
        g, {kiln::canonicalize, kiln::eliminate_common_subexpressions, kiln::eliminate_dead_nodes});
    run(g, {kiln::canonicalize, kiln::eliminate_common_subexpressions, kiln::eliminate_dead_nodes});
    texts.push_back(kiln::to_text(g));
    counts.push_back(computing_nodes(g));
  }
  CHECK(texts[1] == texts[2]);
  CHECK(texts[1] == "%0 = input \"a\" : f32[2,3]\n"
                    "%1 = input \"b\" : f32[2,3]\n"
                    "%2 = param \"w\" : f32[2,3]\n"
                    "%3 = neg(%2) : f32[2,3]\n"
                    "%4 = add_scalar(%3) {value=1} : f32[2,3]\n"
                    "%5 = mul(%0, %4) : f32[2,3]\n"
                    "%6 = mul(%1, %2) : f32[2,3]\n"
                    "%7 = add(%5, %6) : f32[2,3]\n"
                    "outputs: %7\n");
  CHECK(texts[0] == "%0 = input \"a\" : f32[2,3]\n"
                    "%1 = input \"b\" : f32[2,3]\n"
                    "%2 = param \"w\" : f32[2,3]\n"
                    "%3 = sub(%1, %0) : f32[2,3]\n"
                    "%4 = mul(%2, %3) : f32[2,3]\n"
                    "%5 = add(%0, %4) : f32[2,3]\n"
                    "outputs: %5\n");
  CHECK(counts == std::vector<int>{3, 5, 5});

  // Why factoring is not a canonicalisation: a = 1e8, b = 1, w = 1.
  std::vector<float> results;
  for (Form form : {factored, expanded_scalar}) {
    kiln::Graph g;
    build(g, form);
    for (const kiln::Node& node : g.nodes())
      if (const auto* p = std::get_if<kiln::ParamAttrs>(&node.attrs))
        std::fill(p->tensor->f32().begin(), p->tensor->f32().end(), 1.0f);
    kiln::Executor exe = kiln::compile(g, {.threads = 1});
    exe.set_input("a", std::vector<float>(6, 1e8f));
    exe.set_input("b", std::vector<float>(6, 1.0f));
    exe.run();
    results.push_back(exe.output(g.outputs()[0])[0]);
  }
  CHECK(results == std::vector<float>{0.0f, 1.0f});
}

// ---------------------------------------------------------------------------------------------
// the three passes on whole training steps

TEST_CASE("cleanup passes keep training steps computing the same loss and updates") {
  const auto fold_canonicalize_cse = {kiln::fold_constants, kiln::canonicalize,
                                      kiln::eliminate_common_subexpressions,
                                      kiln::eliminate_dead_nodes};
  for (int network = 0; network < 2; ++network) {
    CAPTURE(network);
    kiln::nn::manual_seed(7);
    kiln::Graph g;
    if (network == 0) {
      // A mean squared error: its seed gradient reaches the square's gradient through
      // mul_scalar, reshape and broadcast_to, all foldable.
      kiln::nn::Sequential net{kiln::nn::Linear(6, 8), kiln::nn::ReLU(), kiln::nn::Linear(8, 3)};
      auto x = g.input("x", {5, 6});
      auto target = g.input("target", {5, 3});
      (void)kiln::train_step(kiln::mean(kiln::square(net(x) - target)), net.parameters(),
                             kiln::optim::Adam{.lr = 0.01f, .weight_decay = 0.01f});
      check_same_outputs(g, fold_canonicalize_cse, 3, 1e-4);
    } else {
      kiln::nn::Sequential net{
          kiln::nn::Conv2d(1, 4, 3, 1, 1), kiln::nn::BatchNorm2d(4), kiln::nn::ReLU(),
          kiln::nn::MaxPool2d(2),          kiln::nn::Dropout(0.25f), kiln::nn::Flatten(),
          kiln::nn::Linear(4 * 3 * 3, 2)};
      auto x = g.input("x", {4, 1, 6, 6});
      auto y = g.input("y", {4}, kiln::i32);
      (void)kiln::train_step(
          kiln::softmax_cross_entropy(net(x), y), net.parameters(),
          kiln::optim::SGD{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f});
      check_same_outputs(g, fold_canonicalize_cse, 3, 1e-4);
    }
    auto copy = g.clone();
    kiln::PassContext ctx;
    const auto folded = kiln::fold_constants(*copy, ctx);
    const auto canonical = kiln::canonicalize(*copy, ctx);
    const auto merged = kiln::eliminate_common_subexpressions(*copy, ctx);
    const auto dead = kiln::eliminate_dead_nodes(*copy, ctx);
    kiln::verify(*copy);
    MESSAGE("network " << network << ": " << g.size() << " nodes, " << copy->size()
                       << " after cleanup; folded " << folded.stats[0].second << ", merged "
                       << merged.stats[0].second);
    CHECK(folded.changed == (network == 0));
    CHECK(canonical.changed);
    CHECK(dead.changed);
    CHECK(copy->size() < g.size());
    (void)merged;

    // Every node canonicalize emits is already in canonical form.
    auto twice = g.clone();
    (void)kiln::canonicalize(*twice, ctx);
    CHECK(!kiln::canonicalize(*twice, ctx).changed);
  }
}
