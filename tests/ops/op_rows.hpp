// The op harness's rows: every op with a kernel, on the shapes that reach each of its kernels'
// paths (tails, broadcasts, cache blocks, strides and padding, channels-last forms, ties),
// with each operand's input domain and the tolerance its arithmetic allows. A new op adds its
// rows here and nowhere else in the tests.
#pragma once

#include <vector>

#include "kiln/dist/thread_group.hpp"
#include "ops/op_harness.hpp"

namespace kiln::test {

namespace rows {

inline TensorType f32(Shape s) { return {s, DType::f32}; }
inline Operand in(Shape s, Domain d = {}) { return {f32(s), d, false}; }

/// An elementwise op's entry: the domain of its operands and its attributes; with
/// `to_target_shape`, its one operand broadcasts to the output shape its attributes name.
struct Elementwise {
  Op op;
  Domain domain = uniform(-3.0f, 3.0f);
  Attrs attrs = NoAttrs{};
  bool to_target_shape = false;
};

/// The elementwise ops. Bodies are checked to 1e-5 of the largest result: SIMD exp and log
/// differ from the standard library's in the last bits.
inline const std::vector<Elementwise>& elementwise_ops() {
  static const std::vector<Elementwise> ops = {
      {Op::Add},
      {Op::Sub},
      {Op::Mul},
      {Op::Div, uniform(-3.0f, 3.0f, 0.5f)},
      {Op::Neg},
      {Op::Relu, uniform(-3.0f, 3.0f, 0.05f)},
      {Op::ReluGrad, uniform(-3.0f, 3.0f, 0.05f)},
      {Op::Exp},
      {Op::Log, uniform(0.25f, 3.0f)},
      {Op::Sqrt, uniform(0.25f, 3.0f)},
      {Op::Rsqrt, uniform(0.25f, 3.0f)},
      {Op::Square},
      {Op::MulScalar, uniform(-3.0f, 3.0f), ScalarAttrs{0.75f}},
      {Op::AddScalar, uniform(-3.0f, 3.0f), ScalarAttrs{-1.25f}},
      {Op::BroadcastTo, uniform(-3.0f, 3.0f), NoAttrs{}, true},
  };
  return ops;
}

/// Output, first and second operand shapes an elementwise op is checked on.
struct BroadcastCase {
  Shape out, a, b;
};

inline const std::vector<BroadcastCase> broadcast_cases = {
    {{3, 17}, {3, 17}, {3, 17}},                // same shape, a tail after the vectors
    {{2, 3, 5, 7}, {2, 3, 5, 7}, {1, 3, 1, 1}}, // per-channel bias over NCHW
    {{4, 33}, {4, 33}, {33}},                   // row bias
    {{5, 6}, {5, 1}, {1, 6}},                   // outer product shape
    {{1}, {1}, {1}},                            // one element
    {{2, 64, 13}, {1}, {2, 64, 13}},            // scalar on the left
    // Per-channel operands over channels-last tensors: rows of C elements are merged into
    // long ones, the channel row repeated (BroadcastLoop::widen).
    {{6, 5, 7, 16}, {6, 5, 7, 16}, {16}},
    {{4, 9, 11, 3}, {1, 1, 1, 3}, {4, 9, 11, 3}},
};

/// Small cases for gradients: the first one an op accepts is used.
inline const std::vector<BroadcastCase> gradient_cases = {
    {{3, 4}, {3, 4}, {4}}, {{3, 4}, {3, 4}, {3, 4}}, {{2, 3, 4}, {3, 1}, {1}}};

/// The row of elementwise op `e` on case `c`, if its shape inference accepts it.
inline bool elementwise_row(const Elementwise& e, const BroadcastCase& c, OpRow& row) {
  const int arity = op_info(e.op).arity;
  row = OpRow{e.op, {}, e.attrs};
  if (e.to_target_shape) {
    row.operands = {in(c.a, e.domain)};
    row.attrs = ShapeAttrs{c.out};
  } else if (arity == 1) {
    row.operands = {in(c.out, e.domain)};
  } else {
    row.operands = {in(c.a, e.domain), in(c.b, e.domain)};
  }
  try {
    return row_output(row).shape == c.out;
  } catch (const Error&) {
    return false;
  }
}

inline void add_elementwise(std::vector<OpRow>& out) {
  for (const Elementwise& e : elementwise_ops()) {
    OpRow row;
    for (const BroadcastCase& c : broadcast_cases)
      if (elementwise_row(e, c, row)) out.push_back(row);
    for (const BroadcastCase& c : gradient_cases)
      if (elementwise_row(e, c, row)) {
        row.gradient = true;
        out.push_back(row);
        break;
      }
  }
}

/// A chain with a broadcast operand, and one with scalars, each as one fused kernel.
inline void add_fused(std::vector<OpRow>& out) {
  using F = FusedInstruction;
  FusedAttrs bias_relu{{F{Op::Add, -1, -2}, F{Op::Relu, 0, 0}}, {2, 3, 5, 7}, {}};
  out.push_back({Op::FusedElementwise,
                 {in({2, 3, 5, 7}, uniform(-3, 3)), in({1, 3, 1, 1}, uniform(-3, 3))},
                 bias_relu});
  FusedAttrs lerp{{F{Op::Sub, -2, -1}, F{Op::Mul, 0, -3}, F{Op::Add, -1, 1},
                   F{Op::MulScalar, 2, 2, 0.5f}, F{Op::Exp, 3, 3}},
                  {6, 5, 7, 16},
                  {}};
  out.push_back({Op::FusedElementwise,
                 {in({6, 5, 7, 16}), in({6, 5, 7, 16}), in({16}, uniform(0, 1))},
                 lerp});
}

/// Chains summed as they are computed, in every form the CPU kernel sums: a batchnorm's
/// variance and its gradient's product over NHWC (columns), a product over NCHW (runs of a
/// plane), a sum of everything, a bias gradient's narrow columns, columns over several blocks,
/// interleaved kept axes, one long run, and nothing reduced.
inline void add_fused_sums(std::vector<OpRow>& out) {
  using F = FusedInstruction;
  const auto row = [&](std::vector<Operand> operands, std::vector<FusedInstruction> program,
                       Shape over, Shape to, double tolerance = 1e-5) {
    out.push_back({Op::FusedSumTo, std::move(operands),
                   FusedSumAttrs{FusedAttrs{std::move(program), over, {}}, std::move(to)},
                   tolerance});
  };
  const std::vector<FusedInstruction> centred_square{F{Op::Sub, -1, -2}, F{Op::Square, 0, 0}};
  row({in({8, 14, 14, 16}), in({1, 1, 1, 16})}, centred_square, {8, 14, 14, 16}, {1, 1, 1, 16});
  row({in({16, 7, 9, 32}), in({16, 7, 9, 32})}, {F{Op::Mul, -1, -2}}, {16, 7, 9, 32},
      {1, 1, 1, 32});
  row({in({4, 8, 9, 11}), in({1, 8, 1, 1})}, {F{Op::Mul, -1, -2}, F{Op::Neg, 0, 0}}, {4, 8, 9, 11},
      {1, 8, 1, 1});
  row({in({7, 1000}), in({7, 1000})}, {F{Op::ReluGrad, -1, -2}}, {7, 1000}, {1, 1});
  row({in({64, 10})}, {F{Op::MulScalar, -1, -1, 0.25f}}, {64, 10}, {1, 10});
  row({in({300, 7, 33}), in({33}, uniform(0, 1))}, {F{Op::Mul, -1, -2}, F{Op::Exp, 0, 0}},
      {300, 7, 33}, {1, 1, 33}, 1e-4);
  row({in({2, 3, 4, 5, 6, 7})}, {F{Op::Square, -1, -1}}, {2, 3, 4, 5, 6, 7}, {2, 1, 4, 1, 6, 1});
  row({in({100003}), in({1})}, centred_square, {100003}, {1}, 1e-4);
  row({in({5, 37}), in({5, 1})}, {F{Op::Add, -1, -2}}, {5, 37}, {5, 37});
}

/// Sources, updates and views.
inline void add_state_and_views(std::vector<OpRow>& out) {
  out.push_back({Op::Fill, {}, FillAttrs{2.5f, {37}}, 0.0});
  out.push_back({Op::DropoutMask, {}, DropoutAttrs{0.5f, 11, {1000}}, 0.0});
  out.push_back({Op::DropoutMask, {}, DropoutAttrs{0.1f, 3, {7, 33}}, 0.0});
  out.push_back({Op::Assign, {{f32({37}), {}, true}, in({37})}, NoAttrs{}, 0.0});
  out.push_back({Op::Reshape, {in({2, 3, 4})}, ShapeAttrs{{4, 6}}, 0.0, true});
  out.push_back({Op::Part, {in({10})}, PartAttrs{3, {2, 3}}, 0.0});
}

/// The all-reduce ops over a group of one rank, whose sum is its own data: packing, then the
/// average that is the data itself.
inline void add_collectives(std::vector<OpRow>& out) {
  static const std::shared_ptr<Communicator> alone = [] {
    std::shared_ptr<Communicator> c = dist::thread_group(1)[0];
    c->reserve(1);
    return c;
  }();
  const CollectiveAttrs attrs{alone, 0};
  out.push_back({Op::AllreduceStart, {in({3, 5}), in({7}), in({2, 2, 1, 3})}, attrs, 0.0});
  out.push_back({Op::AllreduceWait, {in({34})}, attrs, 0.0});
}

inline void add_sum_to(std::vector<OpRow>& out) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{64, 128}, {1, 128}},
      {{64, 32, 26, 26}, {1, 32, 1, 1}},
      // Bias gradients over NHWC: one short row summed over many rows, in parallel blocks.
      {{64, 24, 24, 64}, {1, 1, 1, 64}},
      {{16, 26, 26, 33}, {1, 1, 1, 33}},
      {{64, 10}, {64, 1}},
      {{7, 13}, {1, 1}},
      {{100003}, {1}},
      {{3, 1, 5, 17}, {1, 1, 5, 1}},
      {{2, 3, 4, 5, 6, 7}, {1, 3, 1, 5, 1, 7}},
      {{2, 3, 4, 5, 6, 7}, {2, 1, 4, 1, 6, 1}},
      {{5, 37}, {5, 37}},
      {{1, 1}, {1, 1}},
      {{}, {}},
      {{3, 1}, {1, 1}},
      {{1000, 3}, {1, 3}},
      {{3, 1000}, {3, 1}},
      {{2, 700, 33}, {2, 1, 33}},
      {{9, 1, 1, 131}, {1, 1, 1, 131}},
  };
  for (const auto& [from, to] : cases) out.push_back({Op::SumTo, {in(from)}, ShapeAttrs{to}});
  out.push_back({Op::SumTo, {in({2, 3, 4})}, ShapeAttrs{{1, 3, 1}}, 1e-5, true});
}

inline void add_transpose(std::vector<OpRow>& out) {
  const std::vector<int> to_nhwc(nchw_to_nhwc.begin(), nchw_to_nhwc.end());
  const std::vector<int> to_nchw(nhwc_to_nchw.begin(), nhwc_to_nchw.end());
  const std::vector<std::pair<Shape, std::vector<int>>> cases = {
      // NCHW -> NHWC and back: odd sizes, 3 channels (interleaved path), blocks and edges.
      {{2, 3, 5, 7}, to_nhwc},
      {{2, 5, 7, 3}, to_nchw},
      {{1, 2, 9, 5}, to_nhwc},
      {{1, 9, 5, 2}, to_nchw},
      {{2, 4, 3, 3}, to_nhwc},
      {{2, 3, 3, 4}, to_nchw},
      {{3, 17, 9, 11}, to_nhwc},
      {{3, 9, 11, 17}, to_nchw},
      {{2, 64, 24, 24}, to_nhwc},
      {{2, 24, 24, 64}, to_nchw},
      {{1, 300, 7, 3}, to_nhwc}, // rows > one split chunk
      {{1, 7, 3, 300}, to_nchw},
      {{1, 5, 40, 40}, to_nhwc}, // columns > one split chunk
      {{1, 40, 40, 5}, to_nchw},
      {{2, 6, 14, 14}, to_nhwc}, // LeNet-5's 6 channels: blocks overlapping at the edges
      {{2, 14, 14, 6}, to_nchw},
      {{1, 5, 6, 1}, to_nhwc},
      {{4, 1, 6, 6}, to_nhwc}, // a size-1 channel: a copy
      {{4, 8, 1, 1}, to_nhwc},
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
  for (const auto& [shape, perm] : cases)
    out.push_back({Op::Transpose, {in(shape)}, TransposeAttrs{perm}, 0.0});
  for (const auto& [shape, perm] :
       std::vector<std::pair<Shape, std::vector<int>>>{{{2, 3, 4, 5}, to_nhwc},
                                                       {{4, 3, 3, 2}, {2, 3, 1, 0}},
                                                       {{2, 3, 2, 2, 3}, {4, 2, 0, 3, 1}}})
    out.push_back({Op::Transpose, {in(shape)}, TransposeAttrs{perm}, 0.0, true});
}

/// MatMul with each transpose combination: op(A) is m x k, op(B) is k x n. It accumulates
/// up to 9216 products in float in another order than the double reference: 1e-4.
inline void add_matmul(std::vector<OpRow>& out, std::int64_t m, std::int64_t n, std::int64_t k,
                       bool gradient = false) {
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      out.push_back({Op::MatMul,
                     {in(ta ? Shape{k, m} : Shape{m, k}), in(tb ? Shape{n, k} : Shape{k, n})},
                     MatMulAttrs{ta, tb},
                     1e-4,
                     gradient});
}

inline void add_matmuls(std::vector<OpRow>& out) {
  // Small and odd shapes; then depth beyond kc, rows beyond mc, columns beyond nc.
  for (const auto& [m, n, k] : std::vector<std::array<std::int64_t, 3>>{{1, 1, 1},
                                                                        {1, 17, 5},
                                                                        {13, 1, 7},
                                                                        {7, 9, 1},
                                                                        {5, 3, 2},
                                                                        {8, 48, 16},
                                                                        {9, 49, 17},
                                                                        {33, 65, 31},
                                                                        {6, 16, 300},
                                                                        {17, 23, 600},
                                                                        {300, 19, 13},
                                                                        {21, 1100, 20},
                                                                        {70, 130, 257},
                                                                        {70, 130, 40}})
    add_matmul(out, m, n, k);
  add_matmul(out, 3, 4, 5, true);
  // The MNIST CNN's fc1 forward, weight gradient and input gradient, and fc2.
  out.push_back({Op::MatMul, {in({64, 9216}), in({128, 9216})}, MatMulAttrs{false, true}, 1e-4});
  out.push_back({Op::MatMul, {in({64, 128}), in({64, 9216})}, MatMulAttrs{true, false}, 1e-4});
  out.push_back({Op::MatMul, {in({64, 128}), in({128, 9216})}, MatMulAttrs{false, false}, 1e-4});
  out.push_back({Op::MatMul, {in({64, 128}), in({10, 128})}, MatMulAttrs{false, true}, 1e-4});
}

/// A test convolution: x [n,c,h,w], w [o,c,kh,kw].
struct Conv {
  std::int64_t n, c, h, w, o, kh, kw;
  int stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  [[nodiscard]] std::int64_t oh() const { return (h + 2 * pad_h - kh) / stride_h + 1; }
  [[nodiscard]] std::int64_t ow() const { return (w + 2 * pad_w - kw) / stride_w + 1; }
  [[nodiscard]] Conv2dAttrs attrs(bool channels_last) const {
    Conv2dAttrs a;
    a.stride_h = stride_h;
    a.stride_w = stride_w;
    a.pad_h = pad_h;
    a.pad_w = pad_w;
    a.kernel_h = static_cast<int>(kh);
    a.kernel_w = static_cast<int>(kw);
    a.input_h = h;
    a.input_w = w;
    a.channels_last = channels_last;
    return a;
  }
};

/// conv2d and both gradients on `c`, NCHW, 1e-4 like matmul.
inline void add_conv(std::vector<OpRow>& out, const Conv& c, bool gradient = false) {
  const Shape x{c.n, c.c, c.h, c.w}, w{c.o, c.c, c.kh, c.kw}, y{c.n, c.o, c.oh(), c.ow()};
  out.push_back({Op::Conv2d, {in(x), in(w)}, c.attrs(false), 1e-4, gradient});
  out.push_back({Op::Conv2dGradInput, {in(y), in(w)}, c.attrs(false), 1e-4});
  out.push_back({Op::Conv2dGradWeight, {in(x), in(y)}, c.attrs(false), 1e-4});
}

/// The channels-last forms on `c`: activations NHWC, weights packed as each form packs them
/// (HWIO forward, HWOI for the input gradient, which needs 16-channel tiles).
inline void add_conv_channels_last(std::vector<OpRow>& out, const Conv& c) {
  const Shape x{c.n, c.h, c.w, c.c}, y{c.n, c.oh(), c.ow(), c.o};
  out.push_back({Op::Conv2d, {in(x), in({c.kh, c.kw, c.c, c.o})}, c.attrs(true), 1e-4});
  if (c.c % 16 == 0)
    out.push_back({Op::Conv2dGradInput, {in(y), in({c.kh, c.kw, c.o, c.c})}, c.attrs(true), 1e-4});
  out.push_back({Op::Conv2dGradWeight, {in(x), in(y)}, c.attrs(true), 1e-4});
}

/// The Winograd forms of a channels-last 3x3 stride-1 convolution: forward and both gradients.
inline void add_conv_winograd(std::vector<OpRow>& out, const Conv& c) {
  const Shape x{c.n, c.h, c.w, c.c}, y{c.n, c.oh(), c.ow(), c.o};
  Conv2dAttrs a = c.attrs(true);
  a.winograd = true;
  out.push_back({Op::Conv2d, {in(x), in({c.kh, c.kw, c.c, c.o})}, a, 1e-4});
  out.push_back({Op::Conv2dGradInput, {in(y), in({c.kh, c.kw, c.o, c.c})}, a, 1e-4});
  out.push_back({Op::Conv2dGradWeight, {in(x), in(y)}, a, 1e-4});
}

inline void add_convs(std::vector<OpRow>& out) {
  for (const Conv& c : std::vector<Conv>{
           // Stride 1 without padding; padding, as wide as the kernel too (taps reading only
           // padding); strides and non-square kernels; pointwise.
           {2, 1, 28, 28, 32, 3, 3},
           {3, 5, 9, 11, 7, 3, 3},
           {1, 2, 3, 3, 3, 3, 3},
           {2, 3, 7, 6, 5, 3, 3, 1, 1, 1, 1},
           {2, 2, 4, 5, 3, 3, 3, 1, 1, 2, 2},
           {1, 1, 1, 1, 4, 3, 3, 1, 1, 1, 1},
           {2, 3, 9, 10, 4, 3, 3, 2, 2, 1, 1},
           {3, 2, 11, 8, 6, 5, 3, 2, 1, 2, 1},
           {2, 4, 8, 13, 9, 2, 4, 1, 3, 0, 2},
           {2, 8, 5, 7, 6, 1, 1},
           {1, 1, 1, 1, 1, 1, 1},
           {2, 3, 6, 5, 4, 1, 1, 2, 2},
           // LeNet-5's convolutions, over shifted rows of the padded image; and padding as
           // wide as a 2x2 kernel, where the input gradient goes back to a column matrix.
           {3, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2},
           {2, 6, 14, 14, 16, 5, 5},
           {2, 2, 4, 5, 3, 2, 2, 1, 1, 2, 2},
           // The MNIST CNN's second convolution: 288 taps cross the depth block, 576 pixels
           // the column block.
           {3, 32, 26, 26, 64, 3, 3},
           {5, 3, 10, 9, 7, 3, 3, 1, 1, 1, 1}})
    add_conv(out, c);
  for (const Conv& c : std::vector<Conv>{
           {2, 3, 6, 6, 4, 3, 3}, {1, 2, 7, 7, 3, 3, 3, 2, 2, 1, 1}, {2, 1, 5, 5, 2, 1, 1}})
    add_conv(out, c, true);
  for (const Conv& c : std::vector<Conv>{
           // The MNIST CNN's two convolutions; a halo around x (and a narrower one around dy),
           // odd sizes, 48 channels, a 5x5 kernel and a stride-2 forward.
           {2, 1, 28, 28, 32, 3, 3},
           {3, 32, 26, 26, 64, 3, 3},
           {2, 16, 7, 9, 16, 3, 3, 1, 1, 1, 1},
           {2, 48, 6, 5, 48, 3, 3},
           {1, 16, 9, 8, 32, 5, 5, 1, 1, 2, 2},
           {2, 16, 9, 10, 32, 3, 3, 2, 2, 1, 1},
           {5, 16, 6, 6, 16, 3, 3, 1, 1, 1, 1},
           // Strided input gradients, computed by phases: the small ResNet's stride-2
           // convolution; stride 3 over a 5x5 kernel with uneven padding; a 1x1 kernel, whose
           // odd phases meet no tap; different strides across; a stride wider than the kernel.
           {2, 16, 28, 28, 32, 3, 3, 2, 2, 1, 1},
           {2, 16, 11, 10, 16, 5, 5, 3, 3, 2, 1},
           {2, 32, 7, 6, 16, 1, 1, 2, 2},
           {1, 16, 9, 8, 16, 3, 2, 2, 1, 1, 0},
           {2, 16, 10, 9, 16, 2, 2, 3, 3}})
    add_conv_channels_last(out, c);
  for (const Conv& c : std::vector<Conv>{
           // Input gradients scattered pixel by pixel, for channels that are not whole
           // vectors: LeNet-5's second convolution; padding, as wide as the kernel too; strides
           // that leave dx's last rows and columns uncovered; runs of one to four AVX-512
           // vectors (several pieces of 8-lane vectors); one channel; more rows than a tile.
           {2, 6, 14, 14, 16, 5, 5},
           {2, 6, 9, 8, 16, 5, 5, 1, 1, 2, 2},
           {1, 3, 6, 7, 5, 3, 3, 1, 1, 2, 2},
           {2, 3, 11, 10, 8, 3, 3, 2, 2, 1, 1},
           {1, 5, 12, 11, 7, 4, 2, 3, 2, 1, 0},
           {2, 20, 7, 8, 9, 3, 3, 1, 1, 1, 1},
           {1, 12, 6, 6, 4, 5, 5, 1, 1, 2, 2},
           {2, 1, 28, 28, 32, 3, 3},
           {1, 2, 25, 9, 3, 3, 3, 1, 1, 1, 1}})
    out.push_back({Op::Conv2dGradInput,
                   {in({c.n, c.oh(), c.ow(), c.o}), in({c.kh, c.kw, c.o, c.c})},
                   c.attrs(true),
                   1e-4});
  for (const Conv& c : std::vector<Conv>{
           // The MNIST CNN's second convolution (whole tiles, more than one group of them);
           // odd output sizes, whose last tiles hang over the edge; padding of 1 and 2; 48
           // channels (one vector per GEMM tile column).
           {3, 32, 26, 26, 64, 3, 3},
           {2, 16, 7, 9, 16, 3, 3, 1, 1, 1, 1},
           {2, 16, 5, 6, 32, 3, 3, 1, 1, 2, 2},
           {1, 32, 14, 14, 16, 3, 3, 1, 1, 1, 1},
           {2, 48, 6, 5, 48, 3, 3},
           // Outputs too short for F(4x4, 3x3) to save products: the forward pass stays in
           // F(2x2, 3x3) (its input gradient, over the taller input, does not).
           {2, 16, 4, 8, 16, 3, 3},
           {1, 16, 8, 3, 32, 3, 3, 1, 1, 1, 0}})
    add_conv_winograd(out, c);
}

/// A test pooling window over x [n,c,h,w].
struct Pool {
  std::int64_t n, c, h, w;
  int kernel, stride, padding;
  [[nodiscard]] std::int64_t out(std::int64_t in) const {
    return (in + 2 * padding - kernel) / stride + 1;
  }
  [[nodiscard]] Pool2dAttrs attrs(bool channels_last) const {
    Pool2dAttrs a{kernel, stride, padding, h, w};
    a.channels_last = channels_last;
    return a;
  }
};

/// Max and average pooling and their gradients; a maximum is exact.
inline void add_pool(std::vector<OpRow>& out, const Pool& p) {
  const Shape x{p.n, p.c, p.h, p.w}, y{p.n, p.c, p.out(p.h), p.out(p.w)};
  const Attrs a = p.attrs(false);
  out.push_back({Op::MaxPool2d, {in(x)}, a, 0.0});
  out.push_back({Op::AvgPool2d, {in(x)}, a});
  out.push_back({Op::MaxPool2dGrad, {in(x), in(y)}, a});
  out.push_back({Op::MaxPool2dGrad, {in(x, tied()), in(y)}, a});
  out.push_back({Op::AvgPool2dGrad, {in(y)}, a});
}

/// Max pooling channels-last: ties and overlapping windows (added into dx in another order
/// than the reference's) within 1e-6.
inline void add_pool_channels_last(std::vector<OpRow>& out, const Pool& p) {
  const Shape x{p.n, p.h, p.w, p.c}, y{p.n, p.out(p.h), p.out(p.w), p.c};
  const Attrs a = p.attrs(true);
  out.push_back({Op::MaxPool2d, {in(x)}, a, 0.0});
  out.push_back({Op::MaxPool2d, {in(x, tied())}, a, 0.0});
  out.push_back({Op::MaxPool2dGrad, {in(x), in(y)}, a, 1e-6});
  out.push_back({Op::MaxPool2dGrad, {in(x, tied()), in(y)}, a, 1e-6});
}

/// Average pooling and its gradient in the other layouts: both sides channels-last, and the
/// pooled side (y, dy) in the other layout from the unpooled one (x, dx), which fold_reorders
/// makes.
inline void add_avg_pool_other_layouts(std::vector<OpRow>& out, const Pool& p, bool gradient) {
  const Shape nchw_x{p.n, p.c, p.h, p.w}, nchw_y{p.n, p.c, p.out(p.h), p.out(p.w)};
  for (const auto& [channels_last, flip] : {std::pair{true, false}, {false, true}, {true, true}}) {
    Pool2dAttrs a = p.attrs(channels_last);
    a.flip_pooled_layout = flip;
    const Shape x = channels_last ? permuted(nchw_x, nchw_to_nhwc) : nchw_x;
    const Shape y = a.pooled_channels_last() ? permuted(nchw_y, nchw_to_nhwc) : nchw_y;
    out.push_back({Op::AvgPool2d, {in(x)}, a, 1e-5, gradient});
    out.push_back({Op::AvgPool2dGrad, {in(y)}, a, 1e-5, gradient});
  }
}

inline void add_pools(std::vector<OpRow>& out) {
  // Odd sizes, size-1 dims, stride != kernel, padding 1, 2x2/stride-2 fast paths, rows both
  // narrower and wider than a 16-lane vector; 2x2 over even planes by blocks of row pairs
  // across planes (LeNet's pools, and blocks that end in the middle of a plane).
  for (const Pool& p : std::vector<Pool>{
           {2, 3, 26, 26, 2, 2, 0}, {1, 1, 5, 5, 2, 2, 0},     {2, 3, 7, 9, 3, 1, 1},
           {2, 2, 13, 11, 3, 2, 1}, {1, 1, 1, 1, 1, 1, 0},     {2, 3, 17, 19, 2, 1, 0},
           {1, 2, 8, 8, 3, 3, 0},   {1, 1, 6, 40, 3, 2, 0},    {3, 4, 9, 50, 2, 2, 1},
           {1, 1, 4, 70, 1, 2, 0},  {1, 2, 35, 67, 3, 1, 1},   {8, 16, 28, 28, 2, 2, 0},
           {1, 1, 3, 3, 3, 1, 1},   {2, 1, 1, 9, 1, 1, 0},     {1, 1, 10, 37, 2, 2, 0},
           {1, 3, 11, 45, 3, 3, 1}, {1, 1, 2, 2, 2, 2, 0},     {1, 1, 5, 7, 4, 1, 1},
           {2, 2, 33, 33, 5, 2, 2}, {64, 16, 10, 10, 2, 2, 0}, {3, 6, 28, 28, 2, 2, 0},
           {2, 40, 14, 6, 2, 2, 0}})
    add_pool(out, p);
  for (const Pool& p : std::vector<Pool>{{2, 3, 5, 7, 2, 2, 0},
                                         {2, 3, 5, 7, 3, 2, 1},
                                         {2, 16, 8, 8, 2, 2, 0},
                                         {1, 64, 24, 24, 2, 2, 0},
                                         {2, 17, 13, 11, 3, 2, 1},
                                         {1, 5, 9, 9, 3, 1, 1},
                                         {3, 20, 7, 6, 2, 1, 0},
                                         {1, 1, 5, 5, 2, 2, 0},
                                         {2, 70, 6, 10, 3, 3, 0},
                                         {1, 2, 1, 1, 1, 1, 0},
                                         {1, 130, 4, 4, 2, 2, 0},
                                         {2, 4, 33, 33, 5, 2, 2}})
    add_pool_channels_last(out, p);
  // Gradients: distinct values keep each window's maximum where the probe moves it.
  const Pool two{2, 2, 5, 5, 2, 2, 0}, three{2, 2, 5, 5, 3, 2, 1}, nhwc{2, 3, 5, 5, 2, 2, 0};
  out.push_back({Op::MaxPool2d, {in({2, 2, 5, 5}, distinct())}, two.attrs(false), 0.0, true});
  out.push_back({Op::MaxPool2d, {in({2, 2, 5, 5}, distinct())}, three.attrs(false), 0.0, true});
  out.push_back({Op::MaxPool2d, {in({2, 5, 5, 3}, distinct())}, nhwc.attrs(true), 0.0, true});
  out.push_back({Op::AvgPool2d, {in({2, 2, 5, 5})}, three.attrs(false), 1e-5, true});
  out.push_back({Op::AvgPool2dGrad, {in({2, 2, 3, 3})}, three.attrs(false), 1e-5, true});
  // LeNet's two pools; odd sizes (the last row and column uncovered), padding with overlapping
  // windows, stride 1, channels that leave a vector's tail; a wide plane past the row-pair
  // buffer.
  for (const Pool& p : std::vector<Pool>{{3, 6, 28, 28, 2, 2, 0},
                                         {2, 16, 10, 10, 2, 2, 0},
                                         {2, 3, 5, 7, 2, 2, 0},
                                         {2, 5, 7, 9, 3, 2, 1},
                                         {1, 17, 6, 6, 2, 1, 0},
                                         {1, 20, 13, 13, 5, 2, 2},
                                         {1, 2, 4, 1100, 2, 2, 0}})
    add_avg_pool_other_layouts(out, p, false);
  add_avg_pool_other_layouts(out, three, true);
}

/// Log-softmax over the last axis (wide logits check the max shift keeps exp finite), its
/// gradient, and softmax cross-entropy with its gradient, alone and as one kernel.
inline void add_softmax(std::vector<OpRow>& out) {
  for (const Shape& s : std::vector<Shape>{
           {1, 1}, {4, 10}, {64, 10}, {3, 17}, {5, 1000}, {2, 3, 33}, {1}, {7, 1}, {300, 7}}) {
    out.push_back({Op::LogSoftmax, {in(s, uniform(-50, 50))}});
    out.push_back({Op::LogSoftmaxGrad, {in(s, uniform(-5, 0)), in(s)}});
  }
  out.push_back({Op::LogSoftmax, {in({3, 6}, uniform(-2, 2))}, NoAttrs{}, 1e-5, true});
  for (const Shape& s :
       std::vector<Shape>{{64, 10}, {1, 1}, {5, 37}, {3, 1000}, {200, 3}, {2000, 17}}) {
    const Operand logits = in(s, uniform(-20, 20));
    const Operand classes{{Shape{s[0]}, DType::i32}, labels(static_cast<std::int32_t>(s[1]))};
    out.push_back({Op::SoftmaxCrossEntropy, {logits, classes}});
    out.push_back({Op::SoftmaxCrossEntropyGrad, {logits, classes, in({})}});
    out.push_back({Op::SoftmaxCrossEntropyWithGrad, {logits, classes, in({})}});
  }
  out.push_back({Op::SoftmaxCrossEntropy,
                 {in({4, 6}, uniform(-2, 2)), {{Shape{4}, DType::i32}, labels(6)}},
                 NoAttrs{},
                 1e-5,
                 true});
}

} // namespace rows

/// Every row of the harness.
inline const std::vector<OpRow>& op_rows() {
  static const std::vector<OpRow> all = [] {
    std::vector<OpRow> out;
    rows::add_elementwise(out);
    rows::add_fused(out);
    rows::add_fused_sums(out);
    rows::add_state_and_views(out);
    rows::add_collectives(out);
    rows::add_sum_to(out);
    rows::add_transpose(out);
    rows::add_matmuls(out);
    rows::add_convs(out);
    rows::add_pools(out);
    rows::add_softmax(out);
    return out;
  }();
  return all;
}

} // namespace kiln::test
