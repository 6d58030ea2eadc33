// THE list of ops. Every stage (verifier, autodiff, printer, lowering, kernels) is generic
// over this list: adding an op is one line here plus its OpDef (see ops/*.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln {

// X(Name, spelling in the IR text form)
#define KILN_OP_LIST(X)                                                                            \
  /* sources */                                                                                    \
  X(Input, "input")                                                                                \
  X(Param, "param")                                                                                \
  X(Fill, "fill")                                                                                  \
  /* elementwise (ops/elementwise.hpp) */                                                          \
  X(Add, "add")                                                                                    \
  X(Sub, "sub")                                                                                    \
  X(Mul, "mul")                                                                                    \
  X(Div, "div")                                                                                    \
  X(Neg, "neg")                                                                                    \
  X(Relu, "relu")                                                                                  \
  X(ReluGrad, "relu_grad")                                                                         \
  X(Exp, "exp")                                                                                    \
  X(Log, "log")                                                                                    \
  X(Sqrt, "sqrt")                                                                                  \
  X(Rsqrt, "rsqrt")                                                                                \
  X(Square, "square")                                                                              \
  X(MulScalar, "mul_scalar")                                                                       \
  X(AddScalar, "add_scalar")                                                                       \
  X(BroadcastTo, "broadcast_to")                                                                   \
  X(DropoutMask, "dropout_mask")                                                                   \
  /* reductions (ops/reduce.hpp) */                                                                \
  X(SumTo, "sum_to")                                                                               \
  /* shape (ops/shape.hpp) */                                                                      \
  X(Reshape, "reshape")                                                                            \
  X(Part, "part")                                                                                  \
  X(Transpose, "transpose")                                                                        \
  /* anchors (ops/matmul.hpp, ops/conv.hpp) */                                                     \
  X(MatMul, "matmul")                                                                              \
  X(Conv2d, "conv2d")                                                                              \
  X(Conv2dGradInput, "conv2d_grad_input")                                                          \
  X(Conv2dGradWeight, "conv2d_grad_weight")                                                        \
  /* pooling (ops/pool.hpp) */                                                                     \
  X(MaxPool2d, "maxpool2d")                                                                        \
  X(MaxPool2dGrad, "maxpool2d_grad")                                                               \
  X(AvgPool2d, "avgpool2d")                                                                        \
  X(AvgPool2dGrad, "avgpool2d_grad")                                                               \
  /* softmax and losses (ops/loss.hpp) */                                                          \
  X(LogSoftmax, "log_softmax")                                                                     \
  X(LogSoftmaxGrad, "log_softmax_grad")                                                            \
  X(SoftmaxCrossEntropy, "softmax_cross_entropy")                                                  \
  X(SoftmaxCrossEntropyGrad, "softmax_cross_entropy_grad")                                         \
  X(SoftmaxCrossEntropyWithGrad, "softmax_cross_entropy_with_grad")                                \
  /* state update (ops/state.hpp) */                                                               \
  X(Assign, "assign")                                                                              \
  /* data-parallel training (ops/collective.hpp) */                                                \
  X(AllreduceStart, "allreduce_start")                                                             \
  X(AllreduceWait, "allreduce_wait")                                                               \
  /* made by passes (ops/fused.hpp) */                                                             \
  X(FusedElementwise, "fused_elementwise")                                                         \
  X(FusedSumTo, "fused_sum_to")

/// Every op kiln knows. The enumerator order is the order of KILN_OP_LIST.
enum class Op : std::uint8_t {
#define KILN_OP_ENUM(name, spelling) name,
  KILN_OP_LIST(KILN_OP_ENUM)
#undef KILN_OP_ENUM
};

inline constexpr std::size_t op_count = 0
#define KILN_OP_COUNT(name, spelling) +1
    KILN_OP_LIST(KILN_OP_COUNT)
#undef KILN_OP_COUNT
    ;

/// The op's spelling in the IR text form, e.g. "conv2d".
constexpr std::string_view op_name(Op op) {
  constexpr std::array<std::string_view, op_count> names = {
#define KILN_OP_NAME(name, spelling) spelling,
      KILN_OP_LIST(KILN_OP_NAME)
#undef KILN_OP_NAME
  };
  return names[static_cast<std::size_t>(op)];
}

constexpr std::size_t op_index(Op op) { return static_cast<std::size_t>(op); }

/// The most inputs a node (and so a kernel) takes; fused nodes come closest.
inline constexpr int max_op_inputs = 12;

/// Fusion kinds in TVM's order: a producer of a lower kind can be folded into a consumer.
enum class FusionKind : std::uint8_t {
  elementwise,
  broadcast,
  injective,
  reduction,
  anchor,
  opaque
};

} // namespace kiln
