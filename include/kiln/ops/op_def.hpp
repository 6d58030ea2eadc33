// The op contract: what every OpDef<Op> provides, and the contexts its rules receive.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/ir/op_list.hpp"

namespace kiln {

/// What shape inference sees of a node being built. Failing names the node and its inputs:
///   [kiln.verify.shape] node %7 add(%3:[64,10], %5:[64,12]): shapes do not broadcast
struct InferContext {
  const Graph& graph;
  ValueId id;
  Op op;
  const std::vector<ValueId>& inputs;
  const Attrs& attrs;

  [[nodiscard]] const TensorType& in(int i) const {
    return graph.node(inputs[static_cast<std::size_t>(i)]).type;
  }
  [[nodiscard]] int arity() const { return static_cast<int>(inputs.size()); }

  /// The node as printed in messages: "node %7 add(%3:[64,10], %5:[64,12])".
  [[nodiscard]] std::string describe() const {
    std::string s = "node %" + std::to_string(id) + " " + std::string(op_name(op)) + "(";
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (i) s += ", ";
      s += "%" + std::to_string(inputs[i]) + ":" + graph.node(inputs[i]).type.shape.str();
    }
    return s + ")";
  }

  [[noreturn]] void fail(std::string_view code, const std::string& detail) const {
    kiln::fail(code, describe() + ": " + detail);
  }

  template <class A> [[nodiscard]] const A& attr() const {
    const A* a = std::get_if<A>(&attrs);
    if (!a) fail(errc::attr, "missing or wrong attributes for this op");
    return *a;
  }

  void expect_dtype(int i, DType t) const {
    if (in(i).dtype != t)
      fail(errc::dtype, "input " + std::to_string(i) + " is " +
                            std::string(dtype_name(in(i).dtype)) + ", expected " +
                            std::string(dtype_name(t)));
  }
  void expect_rank(int i, int rank) const {
    if (in(i).shape.rank() != rank)
      fail(errc::shape, "input " + std::to_string(i) + " has rank " +
                            std::to_string(in(i).shape.rank()) + ", expected " +
                            std::to_string(rank));
  }
};

/// What a gradient rule sees: the node, the gradient of its output (dy), and which input
/// gradients are wanted. The rule writes dx[i] for the wanted inputs by building nodes.
struct GradContext {
  Graph& graph;
  ValueId id;
  Node node; // a copy: the graph grows while the rule builds
  Value dy;
  std::array<bool, max_op_inputs> needs{};
  std::array<Value, max_op_inputs> dx{};

  [[nodiscard]] Value in(int i) const {
    return Value{&graph, node.inputs[static_cast<std::size_t>(i)]};
  }
  [[nodiscard]] Value out() const { return Value{&graph, id}; }
  [[nodiscard]] bool wants(int i) const { return needs[static_cast<std::size_t>(i)]; }
  template <class A> [[nodiscard]] const A& attr() const { return std::get<A>(node.attrs); }
};

/// What an op's FLOP count sees: the shapes and attributes of one call, as a plan step holds
/// them (physical shapes: a channels-last tensor is [N, H, W, C]).
struct CostContext {
  std::span<const Shape> in;
  const Shape& out;
  const Attrs& attrs;
};

using InferFn = TensorType (*)(const InferContext&);
using GradFn = void (*)(GradContext&);
using FlopsFn = std::int64_t (*)(const CostContext&);

/// Floating-point operations of an anchor's fused epilogue: one per program step and element.
inline std::int64_t epilogue_flops(const CostContext& c) {
  const Epilogue* e = epilogue_of(c.attrs);
  return e ? static_cast<std::int64_t>(e->program.size()) * c.out.numel() : 0;
}

/// What a node of the op is to lowering and to the passes that move, merge or drop nodes.
enum class OpRole : std::uint8_t {
  compute,  ///< computes its value with a kernel (most ops)
  constant, ///< computes the same value every run from its attributes alone (a fill)
  input,    ///< a graph input: the user feeds it before each run; no kernel
  param,    ///< a parameter or optimizer state: storage outside the arena; no kernel
  update,   ///< writes input 1 into input 0, a param; its value is the param's storage
};

/// How the layout pass may store an op's rank-4 activations.
enum class LayoutRule : std::uint8_t {
  nchw,        ///< NCHW only
  elementwise, ///< the output is stored like its rank-4 inputs of its own shape; smaller
               ///< operands broadcast into it in the same layout
  pool,        ///< the output is stored like its rank-4 input, with the attributes' flag set
  reduction,   ///< a sum to a rank-4 shape also reads and writes NHWC
  convolution, ///< a channels-last form (Conv2dAttrs::channels_last) that some targets run
};

/// The operands of a convolution's channels-last form (LayoutRule::convolution): which inputs
/// and whether the output are activations stored NHWC, and which input is a weight packed once
/// per step for it (from OIHW by `weight_pack`, into layout `packed_layout`).
struct ChannelsLastForm {
  std::array<bool, 2> nhwc_inputs{};
  bool nhwc_output = false;
  int packed_weight = -1;
  std::array<int, 4> weight_pack{};
  std::string_view packed_layout;
};

/// A gradient op that one kernel computes together with its forward op (which reads the same
/// leading inputs): `both` writes the gradient, then the forward value, side by side.
struct JointKernel {
  bool exists = false;
  Op forward = Op::Input;
  Op both = Op::Input;
};

/// One op's definition. Each op specialises this once (ops/*.hpp) with:
///   static constexpr int arity;            number of inputs (-1: variadic)
///   static constexpr FusionKind kind;      TVM-style fusion class
///   static TensorType infer(const InferContext&);
///   static void grad(GradContext&);        or `static constexpr GradFn grad = nullptr;`
/// and, where OpDefaults' choice is wrong for it, the properties OpDefaults lists.
/// Elementwise ops also provide the arithmetic, once, over a math policy M (scalar, SIMD or
/// CUDA), marked KILN_HOST_DEVICE so that the CUDA kernels call the same line:
///   `template <class M, class V> KILN_HOST_DEVICE static V apply(const M&, V a, V b, V scalar);`
template <Op op> struct OpDef;

/// Where the scheduler (passes/schedule_for_memory.hpp) runs a node among those ready.
enum class SchedulePriority : std::uint8_t {
  by_memory, ///< by the memory it frees and allocates, as most nodes
  first,     ///< as soon as it is ready: it starts work that overlaps what follows
  last,      ///< only when nothing else is ready: it waits for that work
};

/// Defaults shared by most op definitions: every property lowering and the passes ask.
struct OpDefaults {
  static constexpr OpRole role = OpRole::compute;
  /// The output is a view of input 0's memory (at PartAttrs' offset for a part): no kernel.
  static constexpr bool is_view = false;
  /// Has an arithmetic body (apply): element i of the output from element i of its
  /// (broadcast) inputs, so it can be a step of a fused program or an epilogue.
  static constexpr bool is_elementwise = false;
  /// Its output may take over the memory of any input of its own type that dies at it: every
  /// backend's kernel reads element i of each same-shaped input before writing element i.
  static constexpr bool overwrites_any_input = false;
  /// Swapping its two inputs does not change its value.
  static constexpr bool commutative = false;
  /// A sum of its one input down to the ShapeAttrs' shape that can instead compute the
  /// elementwise chain producing that input and sum it as it goes (fuse_reductions).
  static constexpr bool fusable_sum = false;
  static constexpr LayoutRule layout = LayoutRule::nchw;
  static constexpr SchedulePriority schedule = SchedulePriority::by_memory;
  static constexpr ChannelsLastForm channels_last_form{};
  static constexpr JointKernel joint{};
  /// The input whose memory its output may take over when that input dies here (every
  /// backend's kernel must then read each input element before it writes the output elements
  /// at the same place), or -1; for ops without overwrites_any_input.
  static int overwritable_input(const Attrs&) { return -1; }
  /// Its attributes in the channels-last form the layout pass makes (LayoutRule other than
  /// nchw): a flag set, a target shape permuted.
  static Attrs channels_last_attrs(const Attrs& attrs) { return attrs; }
  /// Its attributes with the rank-4 activation at `port` (an input, or -1 for the output)
  /// stored channels-last or NCHW, the other ports as they are: how fold_reorders lets it read
  /// or write a layout itself. The same attributes where its attributes cannot say that.
  static Attrs port_layout_attrs(const Attrs& attrs, int /*port*/, bool /*channels_last*/) {
    return attrs;
  }
  /// Floating-point operations of one call, what the profiler divides by time: by default
  /// one per output element, right for elementwise ops.
  static std::int64_t flops(const CostContext& c) { return c.out.numel(); }
  /// Bytes of column matrix its NCHW kernel writes and reads back (LayoutRule::convolution):
  /// what its channels-last form saves.
  static std::int64_t column_matrix_bytes(const CostContext&) { return 0; }
};

} // namespace kiln
