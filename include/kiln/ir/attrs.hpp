// Attribute structs of the ops: plain values, copied into the plan and read by kernels.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "kiln/core/communicator.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ir/op_list.hpp"

namespace kiln {

/// Ops without attributes.
struct NoAttrs {
  friend bool operator==(const NoAttrs&, const NoAttrs&) = default;
};

/// A named graph input fed by the user each run. `label_classes` > 0 marks an i32 input used
/// as class labels in [0, label_classes); the executor checks every fed label against it.
struct InputAttrs {
  std::string name;
  std::int64_t label_classes = 0;
  friend bool operator==(const InputAttrs&, const InputAttrs&) = default;
};

/// A persistent tensor (parameter or optimizer state) living outside the arena.
struct ParamAttrs {
  std::string name;
  std::shared_ptr<Tensor> tensor;
  friend bool operator==(const ParamAttrs&, const ParamAttrs&) = default;
};

/// A scalar operand: the factor of mul_scalar, the addend of add_scalar.
struct ScalarAttrs {
  float value = 0.0f;
  friend bool operator==(const ScalarAttrs&, const ScalarAttrs&) = default;
};

/// A target shape: of reshape, broadcast_to and sum_to.
struct ShapeAttrs {
  Shape shape;
  friend bool operator==(const ShapeAttrs&, const ShapeAttrs&) = default;
};

/// A view of `shape` starting `offset` elements into its input's memory: one of the results
/// a multi-result kernel writes side by side.
struct PartAttrs {
  std::int64_t offset = 0;
  Shape shape;
  friend bool operator==(const PartAttrs&, const PartAttrs&) = default;
};

/// An axis permutation (numpy.transpose): output dimension i is input dimension perm[i].
struct TransposeAttrs {
  std::vector<int> perm;
  friend bool operator==(const TransposeAttrs&, const TransposeAttrs&) = default;
};

/// `s` with its axes permuted as a transpose by `perm` permutes them.
inline Shape permuted(const Shape& s, std::span<const int> perm) {
  Shape out = s;
  for (std::size_t i = 0; i < perm.size(); ++i) out[static_cast<int>(i)] = s[perm[i]];
  return out;
}

/// The permutations between the two layouts of a rank-4 activation: NCHW to NHWC and back.
inline constexpr std::array<int, 4> nchw_to_nhwc{0, 2, 3, 1};
inline constexpr std::array<int, 4> nhwc_to_nchw{0, 3, 1, 2};

/// "[0,2,3,1]".
inline std::string perm_text(std::span<const int> perm) {
  std::string s = "[";
  for (std::size_t i = 0; i < perm.size(); ++i) s += (i ? "," : "") + std::to_string(perm[i]);
  return s + "]";
}

/// A tensor of `shape` filled with `value` (e.g. the seed gradient 1 of a loss).
struct FillAttrs {
  float value = 0.0f;
  Shape shape;
  friend bool operator==(const FillAttrs&, const FillAttrs&) = default;
};

/// One step of a fused elementwise kernel: `op` applied to operands a and b (unary ops use
/// a only). An operand >= 0 is the result of an earlier step, < 0 is input -(operand + 1).
struct FusedInstruction {
  Op op = Op::Add;
  std::int8_t a = -1;
  std::int8_t b = -1;
  float scalar = 0.0f; ///< the ScalarAttrs value of mul_scalar / add_scalar
  friend bool operator==(const FusedInstruction&, const FusedInstruction&) = default;
};

/// A fused result that is also written into a param input: `step`'s value goes to input
/// `input` (which has the fused shape). It replaces an assign, e.g. a momentum buffer's
/// update computed on the way to the weight's.
struct FusedStore {
  std::int8_t step = 0;
  std::int8_t input = 0;
  friend bool operator==(const FusedStore&, const FusedStore&) = default;
};

/// An elementwise program an anchor (conv2d, its gradients, matmul) runs over its own result
/// while each piece of it is still in cache: bias, activation, residual add, the relu
/// gradient's mask, an optimizer update. Operand numbering as in FusedInstruction, over the
/// epilogue's inputs: input 0 is the anchor's result, input k >= 1 is the node's input
/// anchor_arity + k - 1. The last step's value is the node's output; stores write params
/// as in a fused elementwise kernel. Made by the fuse_epilogue pass; empty when unfused.
struct Epilogue {
  std::vector<FusedInstruction> program;
  std::vector<FusedStore> stores;
  [[nodiscard]] bool empty() const { return program.empty(); }
  /// Node inputs the epilogue reads besides the anchor's result.
  [[nodiscard]] int extra_inputs() const {
    int most = 0;
    const auto see = [&most](int operand) {
      if (operand < 0) most = std::max(most, -(operand + 1));
    };
    for (const FusedInstruction& f : program) {
      see(f.a);
      see(f.b);
    }
    for (const FusedStore& s : stores) most = std::max(most, static_cast<int>(s.input));
    return most;
  }
  friend bool operator==(const Epilogue&, const Epilogue&) = default;
};

/// Inputs of an anchor op before its epilogue's: (x, w), (dy, w), (x, dy) or (a, b).
inline constexpr int anchor_arity = 2;

/// out = op(a)·op(b) with op = transpose when the flag is set; inputs are row-major 2-D.
struct MatMulAttrs {
  bool transpose_a = false;
  bool transpose_b = false;
  Epilogue epilogue{};
  friend bool operator==(const MatMulAttrs&, const MatMulAttrs&) = default;
};

/// Convolution geometry, shared by conv2d and both its gradients. Weight layout OIHW.
/// `input_h/input_w` and `kernel_h/kernel_w` record the shapes the gradients must produce.
/// `channels_last` is set only by the layout pass: activations are then [N, H, W, C], the
/// weight input is pre-packed ([KH, KW, C, O] for conv2d, [KH, KW, O, C] for the input
/// gradient) and the weight gradient is still OIHW.
struct Conv2dAttrs {
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  int kernel_h = 0, kernel_w = 0;
  std::int64_t input_h = 0, input_w = 0;
  bool channels_last = false;
  /// Multiply in the Winograd domain: F(2x2, 3x3) forward and for the input gradient,
  /// F(3x3, 2x2) for the weight gradient, 16 products where the direct kernel makes 36. Set on
  /// channels-last 3x3 stride-1 convolutions by the winograd pass; a backend without such a
  /// kernel runs the call directly.
  bool winograd = false;
  Epilogue epilogue{};
  friend bool operator==(const Conv2dAttrs&, const Conv2dAttrs&) = default;
};

/// Square pooling window. Padding for max pooling counts as -inf, for average pooling the
/// divisor is always kernel*kernel (PyTorch's count_include_pad=true).
/// `input_h/input_w` record the input size, which avgpool2d_grad must reproduce.
/// `channels_last`: the unpooled tensor (a pool's x, its gradient's dx) is [N, H, W, C]
/// instead of [N, C, H, W]; the layout pass sets it on max pools. `flip_pooled_layout`: the
/// pooled tensor (y, dy) is in the other layout from the unpooled one; set on average pools by
/// fold_reorders, which so folds a reorder beside the pool into it.
struct Pool2dAttrs {
  int kernel = 2;
  int stride = 2;
  int padding = 0;
  std::int64_t input_h = 0, input_w = 0;
  bool channels_last = false;
  bool flip_pooled_layout = false;
  /// Whether the pooled tensor (y, dy) is [N, OH, OW, C].
  [[nodiscard]] bool pooled_channels_last() const { return channels_last != flip_pooled_layout; }
  friend bool operator==(const Pool2dAttrs&, const Pool2dAttrs&) = default;
};

/// Inverted dropout: mask elements are 0 with probability p, else 1/(1-p). The mask is a
/// pure function of (seed, run counter, element index), so it is reproducible and parallel.
struct DropoutAttrs {
  float p = 0.5f;
  std::uint64_t seed = 0;
  Shape shape;
  friend bool operator==(const DropoutAttrs&, const DropoutAttrs&) = default;
};

/// An all-reduce of a bucket of gradients: the ranks of `communicator` average them, as its
/// collective number `slot` (train_step numbers the buckets in the order they start).
struct CollectiveAttrs {
  std::shared_ptr<Communicator> communicator;
  int slot = 0;
  friend bool operator==(const CollectiveAttrs&, const CollectiveAttrs&) = default;
};

/// A chain of elementwise ops run as one kernel, element by element, over `shape`; the
/// last instruction's result is the output. Inputs broadcast to `shape`.
struct FusedAttrs {
  std::vector<FusedInstruction> program;
  Shape shape;
  std::vector<FusedStore> stores;
  friend bool operator==(const FusedAttrs&, const FusedAttrs&) = default;
};

/// A chain of elementwise ops whose result is not stored but summed down to `to` (same rank
/// as chain.shape, each extent kept or 1, as sum_to's target). The chain has no stores.
struct FusedSumAttrs {
  FusedAttrs chain;
  Shape to;
  friend bool operator==(const FusedSumAttrs&, const FusedSumAttrs&) = default;
};

/// Every attribute kind; a node holds exactly one.
using Attrs = std::variant<NoAttrs, InputAttrs, ParamAttrs, ScalarAttrs, ShapeAttrs, PartAttrs,
                           FillAttrs, MatMulAttrs, Conv2dAttrs, Pool2dAttrs, DropoutAttrs,
                           FusedAttrs, FusedSumAttrs, TransposeAttrs, CollectiveAttrs>;

/// The epilogue of an anchor node's attributes, or nullptr for ops that have none.
inline const Epilogue* epilogue_of(const Attrs& attrs) {
  if (const auto* m = std::get_if<MatMulAttrs>(&attrs)) return &m->epilogue;
  if (const auto* c = std::get_if<Conv2dAttrs>(&attrs)) return &c->epilogue;
  return nullptr;
}
inline Epilogue* epilogue_of(Attrs& attrs) {
  return const_cast<Epilogue*>(epilogue_of(static_cast<const Attrs&>(attrs)));
}

} // namespace kiln
