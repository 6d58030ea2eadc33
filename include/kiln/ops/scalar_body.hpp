// Every elementwise op's body over the scalar math policy, as a function pointer per op:
// what constant folding computes and what the kernels are tested against.
#pragma once

#include <array>

#include "kiln/ops/registry.hpp"
#include "kiln/ops/scalar_math.hpp"

namespace kiln {

/// One elementwise op on floats: operands `a` and `b` (`b` is `a` for unary ops) and the
/// op's scalar attribute.
using ScalarBody = float (*)(float a, float b, float scalar);

template <Op op> float scalar_body(float a, float b, float scalar) {
  return OpDef<op>::apply(ScalarMath{}, a, b, scalar);
}

/// The scalar body of every elementwise op, nullptr for the others.
constexpr std::array<ScalarBody, op_count> scalar_bodies() {
  std::array<ScalarBody, op_count> t{};
#define KILN_SCALAR_BODY(name, spelling)                                                           \
  if constexpr (OpDef<Op::name>::is_elementwise) t[op_index(Op::name)] = &scalar_body<Op::name>;
  KILN_OP_LIST(KILN_SCALAR_BODY)
#undef KILN_SCALAR_BODY
  return t;
}

} // namespace kiln
