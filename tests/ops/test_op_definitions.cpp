// The definitions of the ops a layout pass needs, beyond what the op harness checks of every
// op: transpose's and channels-last max pooling's shape inference, text form and errors.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kiln/kiln.hpp"

#include "support/graph_test_helpers.hpp"

namespace {

using kiln::test::error_code;
using kiln::test::error_message;

using kiln::Attrs;
using kiln::Op;
using kiln::Pool2dAttrs;
using kiln::Shape;

const std::vector<int> kToNhwc = {0, 2, 3, 1};

} // namespace

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
  Pool2dAttrs flipped = attrs;
  flipped.flip_pooled_layout = true;
  const std::string msg = error_message([&] { (void)append(g, Op::MaxPool2d, {x.id}, flipped); });
  CHECK(msg.rfind("[kiln.verify.attr] node %", 0) == 0);
  CHECK(msg.find("maxpool2d(") != std::string::npos);
  CHECK(msg.find("flip_pooled_layout") != std::string::npos);
  CHECK(error_code([&] { (void)kiln::max_pool2d_grad(x, y, flipped); }) == "kiln.verify.attr");
}

TEST_CASE("avgpool in other layouts: each side's shape follows its own layout") {
  kiln::Graph g;
  auto x = g.input("x", {2, 5, 7, 3}); // NHWC
  auto y = kiln::avg_pool2d(x, {.kernel = 2, .channels_last = true});
  CHECK(y.shape() == Shape{2, 2, 3, 3});
  Pool2dAttrs a = std::get<Pool2dAttrs>(g.node(y.id).attrs);
  CHECK(kiln::avg_pool2d_grad(y, a).shape() == x.shape());
  const kiln::OpInfo& pool = kiln::op_info(Op::AvgPool2d);
  CHECK(pool.port_channels_last(a, 0));
  CHECK(pool.port_channels_last(a, -1));
  // The pooled side read back as NCHW: x stays NHWC, y is [N, C, OH, OW].
  const Attrs flipped = pool.port_layout_attrs(a, -1, false);
  CHECK(std::get<Pool2dAttrs>(flipped).flip_pooled_layout);
  CHECK(pool.port_channels_last(flipped, 0));
  CHECK(!pool.port_channels_last(flipped, -1));
  auto y_nchw = append(g, Op::AvgPool2d, {x.id}, flipped);
  CHECK(y_nchw.shape() == Shape{2, 3, 2, 3});
  CHECK(kiln::node_text(g, y_nchw.id).find("nhwc, pooled nchw}") != std::string::npos);
  // Its gradient reads dy NCHW and writes dx NHWC; flipping both ports back gives NCHW.
  CHECK(kiln::avg_pool2d_grad(y_nchw, std::get<Pool2dAttrs>(flipped)).shape() == x.shape());
  const kiln::OpInfo& grad = kiln::op_info(Op::AvgPool2dGrad);
  const Attrs back = grad.port_layout_attrs(grad.port_layout_attrs(flipped, -1, false), 0, false);
  CHECK(back == Attrs{Pool2dAttrs{2, 2, 0, 5, 7}});
  // Ops whose attributes cannot place a port say so by returning them unchanged.
  CHECK(kiln::op_info(Op::MaxPool2d).port_layout_attrs(a, -1, false) == Attrs{a});
}
