// Per-target elementwise kernels: every elementwise op's body (ops/elementwise.hpp) run over
// Highway vectors with numpy broadcasting; plus fill, assign and the dropout mask.
#if defined(KILN_CPU_ELEMENTWISE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_ELEMENTWISE_INL_H_
#undef KILN_CPU_ELEMENTWISE_INL_H_
#else
#define KILN_CPU_ELEMENTWISE_INL_H_
#endif

#include <cstring>

#include <hwy/highway.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "hwy/contrib/math/math-inl.h"
#include "kiln/backends/cpu/broadcast_loop.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/core/rng.hpp"
#include "kiln/ops/registry.hpp"
#include "kiln/ops/scalar_math.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// The math policy over Highway vectors; mirrors kiln::ScalarMath member for member.
template <class D> struct HwyMath {
  using V = hn::Vec<D>;
  D d;
  V zero() const { return hn::Zero(d); }
  static V add(V a, V b) { return hn::Add(a, b); }
  static V sub(V a, V b) { return hn::Sub(a, b); }
  static V mul(V a, V b) { return hn::Mul(a, b); }
  static V div(V a, V b) { return hn::Div(a, b); }
  static V max(V a, V b) { return hn::Max(a, b); }
  static V neg(V a) { return hn::Neg(a); }
  V exp(V a) const { return hn::Exp(d, a); }
  V log(V a) const { return hn::Log(d, a); }
  static V sqrt(V a) { return hn::Sqrt(a); }
  V rsqrt(V a) const { return hn::Div(hn::Set(d, 1.0f), hn::Sqrt(a)); }
  V where_positive(V cond, V v) const { return hn::IfThenElseZero(cond > hn::Zero(d), v); }
};

/// One contiguous row: a and b are either contiguous (kVecA/kVecB) or one broadcast scalar.
template <Op op, bool kVecA, bool kVecB>
void ElementwiseRow(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b,
                    float* HWY_RESTRICT out, std::int64_t n, float scalar) {
  using Def = OpDef<op>;
  const hn::ScalableTag<float> d;
  const HwyMath<decltype(d)> m{d};
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  const auto vs = hn::Set(d, scalar);
  const auto a0 = hn::Set(d, a[0]);
  const auto b0 = hn::Set(d, b[0]);
  std::int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto va = kVecA ? hn::LoadU(d, a + i) : a0;
    const auto vb = kVecB ? hn::LoadU(d, b + i) : b0;
    hn::StoreU(Def::apply(m, va, vb, vs), d, out + i);
  }
  for (; i < n; ++i)
    out[i] = Def::apply(ScalarMath{}, kVecA ? a[i] : a[0], kVecB ? b[i] : b[0], scalar);
}

template <Op op> void ElementwiseKernel(const KernelArgs& args) {
  const TensorView& a = args.in[0];
  const TensorView& b = args.num_inputs > 1 ? args.in[1] : args.in[0];
  const auto* s = std::get_if<ScalarAttrs>(args.attrs);
  const float scalar = s ? s->value : 0.0f;
  const BroadcastLoop loop(args.out.shape, a.shape, b.shape);
  using RowFn = void (*)(const float*, const float*, float*, std::int64_t, float);
  constexpr RowFn variants[2][2] = {
      {&ElementwiseRow<op, false, false>, &ElementwiseRow<op, false, true>},
      {&ElementwiseRow<op, true, false>, &ElementwiseRow<op, true, true>}};
  const RowFn row = variants[loop.inner_stride[0]][loop.inner_stride[1]];
  const float* pa = a.f32();
  const float* pb = b.f32();
  float* po = args.out.f32();
  const auto body = [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      std::int64_t oa = 0, ob = 0;
      loop.row_offsets(r, oa, ob);
      row(pa + oa, pb + ob, po + r * loop.inner, loop.inner, scalar);
    }
  };
  const std::int64_t grain =
      std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(loop.inner, 1));
  if (loop.rows <= grain) {
    body(0, loop.rows);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, loop.rows, grain),
                    [&](const tbb::blocked_range<std::int64_t>& r) { body(r.begin(), r.end()); });
}

inline void FillKernel(const KernelArgs& args) {
  const hn::ScalableTag<float> d;
  const float value = std::get_if<FillAttrs>(args.attrs)->value;
  float* out = args.out.f32();
  const std::int64_t n = args.out.numel();
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Set(d, value), d, out + i);
  for (; i < n; ++i) out[i] = value;
}

inline void AssignKernel(const KernelArgs& args) {
  if (args.out.data != args.in[1].data)
    std::memcpy(args.out.data, args.in[1].data,
                static_cast<std::size_t>(args.out.numel()) * dtype_size(args.out.dtype));
}

/// Mask element i is a pure function of (seed, run, i): reproducible and thread-independent.
inline void DropoutMaskKernel(const KernelArgs& args) {
  const auto& attrs = *std::get_if<DropoutAttrs>(args.attrs);
  const float keep_scale = 1.0f / (1.0f - attrs.p);
  const std::uint64_t stream = mix64(attrs.seed ^ mix64(args.run_counter + 0x5bd1e995ULL));
  float* out = args.out.f32();
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, args.out.numel(), 16384),
                    [&](const tbb::blocked_range<std::int64_t>& r) {
                      for (std::int64_t i = r.begin(); i < r.end(); ++i) {
                        const float u = unit_float(mix64(stream + static_cast<std::uint64_t>(i)));
                        out[i] = u < attrs.p ? 0.0f : keep_scale;
                      }
                    });
}

inline void RegisterElementwiseKernels(KernelTable& table) {
#define KILN_REGISTER_ELEMENTWISE(name, spelling)                                                  \
  if constexpr (OpDef<Op::name>::is_elementwise)                                                   \
    table.run[op_index(Op::name)] = &ElementwiseKernel<Op::name>;
  KILN_OP_LIST(KILN_REGISTER_ELEMENTWISE)
#undef KILN_REGISTER_ELEMENTWISE
  table.run[op_index(Op::Fill)] = &FillKernel;
  table.run[op_index(Op::Assign)] = &AssignKernel;
  table.run[op_index(Op::DropoutMask)] = &DropoutMaskKernel;
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
