// The ops a layout pass needs: transpose (kernel vs a scalar reference on every target, shape
// inference, errors, gradient) and channels-last max pooling (NHWC kernels vs the NCHW ones
// after transposing, in-place gradient, shape inference, errors, gradient).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernel_harness.hpp"
#include "kiln/kiln.hpp"

#include "graph_test_helpers.hpp"
#include "target_loop.hpp"

namespace {

using kiln::test::error_code;
using kiln::test::error_message;

using kiln::Attrs;
using kiln::Op;
using kiln::Pool2dAttrs;
using kiln::Shape;
using kiln::TransposeAttrs;
using kiln::Value;
using kiln::ValueId;
using kiln::cpu::KernelTable;
using kiln::test::random_values;
using kiln::test::relative_error;
using kiln::test::tied_values;
using kiln::test::view;

/// Scalar transpose: out[idx] = x[idx permuted back], element by element.
template <class T>
std::vector<T> ref_transpose(const std::vector<T>& x, const Shape& xs,
                             const std::vector<int>& perm) {
  const Shape ys = permuted(xs, perm);
  const int rank = xs.rank();
  std::vector<std::int64_t> in_stride(static_cast<std::size_t>(rank), 1);
  for (int a = rank - 2; a >= 0; --a)
    in_stride[static_cast<std::size_t>(a)] = in_stride[static_cast<std::size_t>(a + 1)] * xs[a + 1];
  std::vector<T> y(x.size());
  std::vector<std::int64_t> idx(static_cast<std::size_t>(rank), 0);
  for (std::int64_t flat = 0; flat < ys.numel(); ++flat) {
    std::int64_t src = 0;
    for (int i = 0; i < rank; ++i)
      src += idx[static_cast<std::size_t>(i)] *
             in_stride[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])];
    y[static_cast<std::size_t>(flat)] = x[static_cast<std::size_t>(src)];
    for (int i = rank - 1; i >= 0; --i) {
      if (++idx[static_cast<std::size_t>(i)] < ys[i]) break;
      idx[static_cast<std::size_t>(i)] = 0;
    }
  }
  return y;
}

const std::vector<int> kToNhwc = {0, 2, 3, 1};
const std::vector<int> kToNchw = {0, 3, 1, 2};

struct TransposeCase {
  Shape shape;
  std::vector<int> perm;
};

std::string case_name(const TransposeCase& c) {
  std::string s = c.shape.str() + " perm";
  for (int p : c.perm) s += " " + std::to_string(p);
  return s;
}

} // namespace

TEST_CASE("transpose kernel: matches the scalar reference on every target") {
  const std::vector<TransposeCase> cases = {
      // NCHW -> NHWC and back: odd sizes, 3 channels (interleaved path), blocks and edges.
      {{2, 3, 5, 7}, kToNhwc},
      {{2, 5, 7, 3}, kToNchw},
      {{1, 2, 9, 5}, kToNhwc},
      {{1, 9, 5, 2}, kToNchw},
      {{2, 4, 3, 3}, kToNhwc},
      {{2, 3, 3, 4}, kToNchw},
      {{3, 17, 9, 11}, kToNhwc},
      {{3, 9, 11, 17}, kToNchw},
      {{2, 64, 24, 24}, kToNhwc},
      {{2, 24, 24, 64}, kToNchw},
      {{1, 300, 7, 3}, kToNhwc}, // rows > one split chunk
      {{1, 7, 3, 300}, kToNchw},
      {{1, 5, 40, 40}, kToNhwc}, // columns > one split chunk
      {{1, 40, 40, 5}, kToNchw},
      {{4, 1, 6, 6}, kToNhwc}, // a size-1 channel: a copy
      {{4, 8, 1, 1}, kToNhwc},
      // OIHW weight repacks to [KH, KW, I, O] and [KH, KW, O, I].
      {{16, 3, 3, 3}, {2, 3, 1, 0}},
      {{16, 3, 3, 3}, {2, 3, 0, 1}},
      {{33, 17, 5, 5}, {2, 3, 1, 0}},
      {{33, 17, 5, 5}, {2, 3, 0, 1}},
      {{8, 5, 1, 1}, {2, 3, 1, 0}},
      // Generic ranks 2, 3, 5, 6 and copies of whole runs.
      {{1000, 3}, {1, 0}},
      {{3, 1000}, {1, 0}},
      {{37, 301}, {1, 0}},
      {{5, 7, 9}, {2, 0, 1}},
      {{5, 7, 9}, {1, 0, 2}},
      {{5, 7, 9}, {0, 2, 1}},
      {{5, 7, 9}, {2, 1, 0}},
      {{2, 3, 4, 5, 6}, {4, 2, 0, 3, 1}},
      {{3, 2, 5, 4, 7}, {0, 3, 4, 1, 2}},
      {{2, 1, 3, 2, 5, 3}, {5, 4, 3, 2, 1, 0}},
      {{2, 3, 2, 2, 3, 2}, {1, 0, 3, 2, 5, 4}},
      {{2, 3, 4}, {0, 1, 2}},
      {{7}, {0}},
  };
  for (const TransposeCase& c : cases) {
    std::vector<float> x = random_values(c.shape.numel(), 3);
    const std::vector<float> want = ref_transpose(x, c.shape, c.perm);
    const Attrs attrs = TransposeAttrs{c.perm};
    kiln::test::for_each_target([&](const KernelTable& t) {
      INFO("target " << std::string(t.target_name) << " " << case_name(c));
      const std::vector<float> got = kiln::test::run_kernel(t, Op::Transpose, {view(x, c.shape)},
                                                            permuted(c.shape, c.perm), &attrs);
      CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
    });
  }
}

TEST_CASE("transpose kernel: moves i32 elements unchanged") {
  const Shape s{2, 3, 5, 7};
  std::vector<std::int32_t> x(2 * 3 * 5 * 7);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::int32_t>(i * 2654435761u);
  const std::vector<std::int32_t> want = ref_transpose(x, s, kToNhwc);
  const Attrs attrs = TransposeAttrs{kToNhwc};
  std::vector<std::int32_t> out(x.size(), -1);
  kiln::KernelArgs args;
  args.in[0] = view(x, s);
  args.num_inputs = 1;
  args.out = view(out, permuted(s, kToNhwc));
  args.attrs = &attrs;
  kiln::test::for_each_target([&](const KernelTable& t) {
    INFO("target " << std::string(t.target_name));
    std::fill(out.begin(), out.end(), -1);
    kiln::cpu::select(t, Op::Transpose, args).kernel(args);
    CHECK(out == want);
  });
}

TEST_CASE("transpose: builder, shape inference, printing and bad permutations") {
  kiln::Graph g;
  auto x = g.input("x", {2, 3, 5, 7});
  auto y = kiln::transpose(x, kToNhwc);
  CHECK(y.shape() == Shape{2, 5, 7, 3});
  CHECK(kiln::transpose(x, {0, 1, 2, 3}).id == x.id); // the identity is x itself
  CHECK(kiln::transpose(y, {3, 2, 1, 0}).shape() == Shape{3, 7, 5, 2});
  CHECK(kiln::node_text(g, y.id) == "%1 = transpose(%0) {perm=[0,2,3,1]} : f32[2,5,7,3]");
  const kiln::OpInfo& info = kiln::op_info(Op::Transpose);
  CHECK(info.name == "transpose");
  CHECK(info.kind == kiln::FusionKind::injective);
  CHECK_FALSE(info.is_view);
  CHECK_FALSE(info.is_elementwise);
  // A layout transform is drawn as a hexagon that names its permutation.
  CHECK(kiln::to_dot(g).find("n1 [label=\"%1 transpose {perm=[0,2,3,1]}\\nf32[2,5,7,3]\", "
                             "shape=hexagon") != std::string::npos);

  const std::string msg = error_message([&] { (void)kiln::transpose(x, {0, 2, 2, 1}); });
  CHECK(msg == "[kiln.verify.attr] node %3 transpose(%0:[2,3,5,7]): perm [0,2,2,1] is not a "
               "permutation of 0..3 (input rank 4)");
  CHECK(error_code([&] { (void)kiln::transpose(x, {0, 2, 1}); }) == "kiln.verify.attr");
  CHECK(error_code([&] { (void)kiln::transpose(x, {0, 1, 2, 3, 4}); }) == "kiln.verify.attr");
  CHECK(error_code([&] { (void)kiln::transpose(x, {0, 2, 3, 4}); }) == "kiln.verify.attr");
  CHECK(error_code([&] { (void)kiln::transpose(x, {-1, 2, 3, 1}); }) == "kiln.verify.attr");
  CHECK(error_code([&] { (void)append(g, Op::Transpose, {x.id}); }) == "kiln.verify.attr");
}

TEST_CASE("transpose: compiled graphs compute it, and its gradient matches finite differences") {
  // Through the executor: NCHW -> NHWC -> NCHW is the identity, element for element.
  kiln::Graph g;
  auto x = g.input("x", {2, 3, 5, 7});
  auto nhwc = kiln::transpose(x, kToNhwc);
  auto back = kiln::transpose(nhwc, kToNchw);
  g.mark_output(nhwc);
  g.mark_output(back);
  kiln::Executor exe = kiln::compile(g, {.threads = 2});
  std::vector<float> data = random_values(2 * 3 * 5 * 7, 5);
  exe.set_input("x", data);
  exe.run();
  const auto got_nhwc = exe.output(nhwc);
  const auto got_back = exe.output(back);
  CHECK(std::vector<float>(got_nhwc.begin(), got_nhwc.end()) ==
        ref_transpose(data, Shape{2, 3, 5, 7}, kToNhwc));
  CHECK(std::vector<float>(got_back.begin(), got_back.end()) == data);

  const auto random_tensor = [](Shape shape, std::uint32_t seed) {
    auto t = std::make_shared<kiln::Tensor>(shape);
    const std::vector<float> v = random_values(shape.numel(), seed);
    std::copy(v.begin(), v.end(), t->f32().begin());
    return t;
  };
  // loss = sum(transpose(p) * R): every output element has its own weight.
  const auto check = [&](Shape shape, std::vector<int> perm) {
    const kiln::GradCheckResult r = kiln::check_gradients(
        [&](kiln::Graph& graph, const std::vector<Value>& p) {
          const Value out = kiln::transpose(p[0], perm);
          return kiln::sum(out * graph.param("R", random_tensor(out.shape(), 99)));
        },
        {random_tensor(shape, 7)});
    INFO(r.worst);
    CHECK(r.ok);
  };
  check({2, 3, 4, 5}, kToNhwc);
  check({2, 4, 5, 3}, kToNchw);
  check({4, 3, 3, 2}, {2, 3, 1, 0});
  check({3, 4, 5}, {2, 0, 1});
  check({2, 3, 2, 2, 3}, {4, 2, 0, 3, 1});
}

TEST_CASE("transpose: in place over a dying input when the batch axis stays first") {
  // relu(x) dies at the transpose, which then reorders it image by image in its own memory;
  // a weight-style permutation that moves the batch axis gets a buffer of its own.
  for (const std::vector<int>& perm :
       {std::vector<int>{0, 2, 3, 1}, std::vector<int>{0, 3, 1, 2}, std::vector<int>{2, 3, 1, 0}}) {
    CAPTURE(perm.size());
    CAPTURE(perm[0]);
    for (const int threads : {1, 2}) {
      kiln::Graph g;
      auto x = g.input("x", {3, 4, 5, 6});
      auto t = kiln::transpose(kiln::relu(x), perm);
      g.mark_output(kiln::exp(t));
      kiln::Executor exe = kiln::compile(g, {.threads = threads});
      bool in_place = false;
      for (const kiln::PlanStep& s : exe.plan().steps)
        if (s.op == Op::Transpose) in_place = s.output.offset == s.inputs[0].offset;
      CHECK(in_place == (perm[0] == 0));
      const std::vector<float> data = random_values(3 * 4 * 5 * 6, 11);
      std::vector<float> relu(data);
      for (float& v : relu) v = std::max(v, 0.0f);
      std::vector<float> want = ref_transpose(relu, Shape{3, 4, 5, 6}, perm);
      for (float& v : want) v = std::exp(v);
      exe.set_input("x", data);
      exe.run();
      const auto got = exe.output(g.outputs()[0]);
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < want.size(); ++i)
        CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-6));
    }
  }
}

namespace {

struct PoolCase {
  std::int64_t n, c, h, w;
  int kernel, stride, padding;
};

std::string pool_name(const PoolCase& p) {
  return "[" + std::to_string(p.n) + "," + std::to_string(p.c) + "," + std::to_string(p.h) + "," +
         std::to_string(p.w) + "] k" + std::to_string(p.kernel) + " s" + std::to_string(p.stride) +
         " p" + std::to_string(p.padding);
}

std::int64_t pool_out(std::int64_t in, const PoolCase& p) {
  return (in + 2 * p.padding - p.kernel) / p.stride + 1;
}

} // namespace

TEST_CASE("maxpool channels-last: forward and gradient equal the NCHW kernels transposed") {
  const std::vector<PoolCase> cases = {
      {2, 3, 5, 7, 2, 2, 0},    {2, 3, 5, 7, 3, 2, 1},    {2, 16, 8, 8, 2, 2, 0},
      {1, 64, 24, 24, 2, 2, 0}, {2, 17, 13, 11, 3, 2, 1}, {1, 5, 9, 9, 3, 1, 1},
      {3, 20, 7, 6, 2, 1, 0},   {1, 1, 5, 5, 2, 2, 0},    {2, 70, 6, 10, 3, 3, 0},
      {1, 2, 1, 1, 1, 1, 0},    {1, 130, 4, 4, 2, 2, 0},  {2, 4, 33, 33, 5, 2, 2},
  };
  for (const PoolCase& pc : cases) {
    const Shape xs{pc.n, pc.c, pc.h, pc.w};
    const Shape ys{pc.n, pc.c, pool_out(pc.h, pc), pool_out(pc.w, pc)};
    const Shape xs_nhwc = permuted(xs, kToNhwc), ys_nhwc = permuted(ys, kToNhwc);
    Pool2dAttrs nchw{pc.kernel, pc.stride, pc.padding, pc.h, pc.w};
    Pool2dAttrs nhwc = nchw;
    nhwc.channels_last = true;
    const Attrs nchw_attrs = nchw, nhwc_attrs = nhwc;
    // Counted from the case, not the shapes: GCC 12 warns about Shape::numel() here.
    const std::int64_t x_count = pc.n * pc.c * pc.h * pc.w;
    std::vector<float> dy =
        random_values(pc.n * pc.c * pool_out(pc.h, pc) * pool_out(pc.w, pc), 13);
    std::vector<float> dy_nhwc = ref_transpose(dy, ys, kToNhwc);
    for (const bool tied : {false, true}) {
      std::vector<float> x = tied ? tied_values(x_count, 17) : random_values(x_count, 11);
      std::vector<float> x_nhwc = ref_transpose(x, xs, kToNhwc);
      kiln::test::for_each_target([&](const KernelTable& t) {
        INFO("target " << std::string(t.target_name) << " " << pool_name(pc)
                       << std::string(tied ? " tied" : ""));
        const auto want_y = ref_transpose(
            kiln::test::run_kernel(t, Op::MaxPool2d, {view(x, xs)}, ys, &nchw_attrs), ys, kToNhwc);
        const auto want_dx =
            ref_transpose(kiln::test::run_kernel(t, Op::MaxPool2dGrad, {view(x, xs), view(dy, ys)},
                                                 xs, &nchw_attrs),
                          xs, kToNhwc);
        CHECK(relative_error(kiln::test::run_kernel(t, Op::MaxPool2d, {view(x_nhwc, xs_nhwc)},
                                                    ys_nhwc, &nhwc_attrs),
                             want_y) == 0.0);
        const std::vector<float> dx = kiln::test::run_kernel(
            t, Op::MaxPool2dGrad, {view(x_nhwc, xs_nhwc), view(dy_nhwc, ys_nhwc)}, xs_nhwc,
            &nhwc_attrs);
        // Overlapping windows add into dx in another order than the NCHW kernel's vector
        // blocks do; a wrong tie would be off by a whole dy.
        CHECK(relative_error(dx, want_dx) <= 1e-6);
        // Where the op lets dx take over x's memory, the kernel must give the same result.
        if (kiln::op_info(Op::MaxPool2dGrad).overwritable_input(nhwc_attrs) == 0) {
          std::vector<float> in_place = x_nhwc;
          kiln::KernelArgs args;
          args.in[0] = view(in_place, xs_nhwc);
          args.in[1] = view(dy_nhwc, ys_nhwc);
          args.num_inputs = 2;
          args.out = view(in_place, xs_nhwc);
          args.attrs = &nhwc_attrs;
          kiln::cpu::select(t, Op::MaxPool2dGrad, args).kernel(args);
          CHECK(in_place == dx);
        }
      });
    }
  }
}

TEST_CASE("maxpool channels-last: shape inference, printing and errors") {
  kiln::Graph g;
  auto x = g.input("x", {2, 5, 7, 3}); // NHWC
  auto y = kiln::max_pool2d(x, {.kernel = 2, .channels_last = true});
  CHECK(y.shape() == Shape{2, 2, 3, 3});
  CHECK(kiln::node_text(g, y.id) ==
        "%1 = maxpool2d(%0) {kernel=2, stride=2, pad=0, nhwc} : f32[2,2,3,3]");
  auto y3 = kiln::max_pool2d(x, {.kernel = 3, .stride = 2, .padding = 1, .channels_last = true});
  CHECK(y3.shape() == Shape{2, 3, 4, 3});
  const Pool2dAttrs attrs = std::get<Pool2dAttrs>(g.node(y.id).attrs);
  CHECK(attrs.channels_last);
  CHECK(attrs.input_h == 5);
  CHECK(attrs.input_w == 7);
  auto dx = kiln::max_pool2d_grad(x, y, attrs);
  CHECK(dx.shape() == x.shape());
  CHECK(kiln::op_info(Op::MaxPool2dGrad).overwritable_input(Attrs{attrs}) == 0);
  // NCHW text is unchanged.
  auto nchw = kiln::max_pool2d(g.input("img", {1, 1, 4, 4}));
  CHECK(kiln::node_text(g, nchw.id).find("{kernel=2, stride=2, pad=0} :") != std::string::npos);

  CHECK(error_code([&] { (void)kiln::max_pool2d_grad(x, y3, attrs); }) == "kiln.verify.shape");
  CHECK(error_code([&] {
          (void)kiln::max_pool2d(g.input("small", {1, 1, 1, 8}),
                                 {.kernel = 2, .channels_last = true});
        }) == "kiln.verify.shape");
  const std::string msg =
      error_message([&] { (void)kiln::avg_pool2d(x, {.kernel = 2, .channels_last = true}); });
  CHECK(msg.rfind("[kiln.verify.attr] node %", 0) == 0);
  CHECK(msg.find("avgpool2d(") != std::string::npos);
  CHECK(msg.find("channels_last") != std::string::npos);
  Pool2dAttrs nhwc_avg{2, 2, 0, 4, 4};
  nhwc_avg.channels_last = true;
  CHECK(error_code([&] {
          (void)kiln::avg_pool2d_grad(g.input("dy", {1, 2, 2, 1}), nhwc_avg);
        }) == "kiln.verify.attr");
}

TEST_CASE("maxpool channels-last: compiled graphs and gradients") {
  // Distinct, well separated values keep each window's maximum stable under the probe.
  const auto distinct = [](Shape shape, std::uint64_t seed) {
    auto t = std::make_shared<kiln::Tensor>(shape);
    auto data = t->f32();
    for (std::size_t i = 0; i < data.size(); ++i)
      data[i] = 0.01f * static_cast<float>((i * 37) % data.size());
    kiln::Rng rng(seed);
    for (std::size_t i = data.size() - 1; i > 0; --i) std::swap(data[i], data[rng.below(i + 1)]);
    return t;
  };
  const auto project = [](Value out) {
    auto r = std::make_shared<kiln::Tensor>(out.shape());
    const std::vector<float> v = random_values(out.shape().numel(), 99);
    std::copy(v.begin(), v.end(), r->f32().begin());
    return kiln::sum(out * out.graph->param("R", r));
  };
  for (const kiln::Pool2dOptions& o :
       {kiln::Pool2dOptions{.kernel = 2, .channels_last = true},
        kiln::Pool2dOptions{.kernel = 3, .stride = 2, .padding = 1, .channels_last = true}}) {
    INFO("kernel " << o.kernel);
    const kiln::GradCheckResult r = kiln::check_gradients(
        [&](kiln::Graph&, const std::vector<Value>& p) {
          return project(kiln::max_pool2d(p[0], o));
        },
        {distinct({2, 5, 5, 3}, 25)});
    INFO(r.worst);
    CHECK(r.ok);

    // NCHW pooling equals transposing to NHWC, pooling there and transposing back, in the
    // forward values and in the gradient the whole chain gives x.
    kiln::Graph g;
    auto x = g.input("x", {2, 3, 7, 5});
    kiln::Pool2dOptions nchw_o = o;
    nchw_o.channels_last = false;
    auto direct = kiln::max_pool2d(x, nchw_o);
    auto via = kiln::transpose(kiln::max_pool2d(kiln::transpose(x, kToNhwc), o), kToNchw);
    auto dy = g.input("dy", direct.shape());
    const Pool2dAttrs nchw_attrs = std::get<Pool2dAttrs>(g.node(direct.id).attrs);
    const ValueId pooled_nhwc = g.node(via.id).inputs[0];
    const Value x_nhwc{&g, g.node(pooled_nhwc).inputs[0]};
    const Pool2dAttrs nhwc_attrs = std::get<Pool2dAttrs>(g.node(pooled_nhwc).attrs);
    CHECK(nhwc_attrs.channels_last);
    auto grad_direct = kiln::max_pool2d_grad(x, dy, nchw_attrs);
    auto dy_nhwc = kiln::transpose(dy, kToNhwc);
    auto grad_via = kiln::transpose(kiln::max_pool2d_grad(x_nhwc, dy_nhwc, nhwc_attrs), kToNchw);
    for (const Value& v : {direct, via, grad_direct, grad_via}) g.mark_output(v);
    kiln::Executor exe = kiln::compile(g, {.threads = 2});
    std::vector<float> xd = tied_values(2 * 3 * 7 * 5, 41);
    std::vector<float> dyd = random_values(direct.shape().numel(), 43);
    exe.set_input("x", xd);
    exe.set_input("dy", dyd);
    exe.run();
    const auto a = exe.output(direct), b = exe.output(via);
    CHECK(std::vector<float>(a.begin(), a.end()) == std::vector<float>(b.begin(), b.end()));
    const auto ga = exe.output(grad_direct), gb = exe.output(grad_via);
    CHECK(std::vector<float>(ga.begin(), ga.end()) == std::vector<float>(gb.begin(), gb.end()));
  }
}
