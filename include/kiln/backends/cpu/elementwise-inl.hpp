// Per-target elementwise kernels: every elementwise op's body (ops/elementwise.hpp) run over
// Highway vectors with numpy broadcasting; fused programs (fused_elementwise nodes and the
// epilogues anchors run over their output); plus fill, assign and the dropout mask.
#if defined(KILN_CPU_ELEMENTWISE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_ELEMENTWISE_INL_H_
#undef KILN_CPU_ELEMENTWISE_INL_H_
#else
#define KILN_CPU_ELEMENTWISE_INL_H_
#endif

#include <algorithm>
#include <array>
#include <cstring>
#include <span>
#include <vector>

#include <hwy/highway.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "hwy/contrib/math/math-inl.h"
#include "kiln/backends/cpu/broadcast_loop.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/variants.hpp"
#include "kiln/backends/cpu/workspace.hpp"
#include "kiln/core/rng.hpp"
#include "kiln/ops/registry.hpp"
#include "kiln/ops/scalar_math.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// max_keeping_nan lane by lane: the instruction's own max passes one operand's NaN through
/// and drops the other's.
template <class V> HWY_INLINE V MaxKeepingNaN(V a, V b) {
  return hn::IfThenElse(hn::Or(hn::Lt(a, b), hn::IsNaN(b)), b, a);
}

/// The math policy over Highway vectors; mirrors kiln::ScalarMath member for member.
template <class D> struct HwyMath {
  using V = hn::Vec<D>;
  D d;
  V zero() const { return hn::Zero(d); }
  static V add(V a, V b) { return hn::Add(a, b); }
  static V sub(V a, V b) { return hn::Sub(a, b); }
  static V mul(V a, V b) { return hn::Mul(a, b); }
  static V div(V a, V b) { return hn::Div(a, b); }
  static V max(V a, V b) { return MaxKeepingNaN(a, b); }
  static V neg(V a) { return hn::Neg(a); }
  V exp(V a) const { return hn::Exp(d, a); }
  V log(V a) const { return hn::Log(d, a); }
  static V sqrt(V a) { return hn::Sqrt(a); }
  V rsqrt(V a) const { return hn::Div(hn::Set(d, 1.0f), hn::Sqrt(a)); }
  V where_positive(V cond, V v) const { return hn::IfThenElseZero(cond > hn::Zero(d), v); }
};

/// One contiguous row: a and b are either contiguous (kVecA/kVecB) or one broadcast scalar.
/// `out` may be `a` or `b` (in-place steps): each element is read before it is written.
// Flattened: the op's apply is a template compiled for the baseline target, so GCC will not
// inline the policy's vector operations into it and would leave calls (one per vector) in the
// loop; flattening inlines them into this function, which has the target's attributes.
template <Op op, bool kVecA, bool kVecB>
__attribute__((flatten)) void ElementwiseRow(const float* a, const float* b, float* out,
                                             std::int64_t n, float scalar) {
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

using RowFn = void (*)(const float*, const float*, float*, std::int64_t, float);
/// The four row variants of one op: [a contiguous][b contiguous].
using RowVariants = std::array<std::array<RowFn, 2>, 2>;

template <Op op> constexpr RowVariants row_variants() {
  return {{{&ElementwiseRow<op, false, false>, &ElementwiseRow<op, false, true>},
           {&ElementwiseRow<op, true, false>, &ElementwiseRow<op, true, true>}}};
}

/// Row functions of every elementwise op, indexed by op_index (others stay null).
inline const std::array<RowVariants, op_count>& RowTable() {
  static const std::array<RowVariants, op_count> table = [] {
    std::array<RowVariants, op_count> t{};
#define KILN_ROW_VARIANTS(name, spelling)                                                          \
  if constexpr (OpDef<Op::name>::is_elementwise) t[op_index(Op::name)] = row_variants<Op::name>();
    KILN_OP_LIST(KILN_ROW_VARIANTS)
#undef KILN_ROW_VARIANTS
    return t;
  }();
  return table;
}

/// Runs body(row, first, count) over pieces of at most `chunk` elements of every row, in
/// parallel: a same-shape op folds to one long row, which must still use every thread.
template <class Body>
void ForEachChunk(const BroadcastLoop& loop, std::int64_t chunk, const Body& body) {
  const std::int64_t per_row = (loop.inner + chunk - 1) / chunk;
  const std::int64_t tiles = loop.rows * per_row;
  const auto run = [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t first = (t % per_row) * chunk;
      body(t / per_row, first, std::min(chunk, loop.inner - first));
    }
  };
  // About 32k elements per task: enough to hide the scheduling cost.
  const std::int64_t grain =
      std::max<std::int64_t>(1, 32768 / std::min(chunk, std::max<std::int64_t>(loop.inner, 1)));
  if (tiles <= grain) {
    run(0, tiles);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, tiles, grain),
                    [&](const tbb::blocked_range<std::int64_t>& r) { run(r.begin(), r.end()); });
}

inline BroadcastLoop LoopOf(const KernelArgs& args) {
  std::array<Shape, max_op_inputs> shapes{};
  for (int k = 0; k < args.num_inputs; ++k)
    shapes[static_cast<std::size_t>(k)] = args.in[static_cast<std::size_t>(k)].shape;
  return BroadcastLoop(
      args.out.shape,
      std::span<const Shape>(shapes.data(), static_cast<std::size_t>(args.num_inputs)));
}

/// Copies of the periodic operands of a widened broadcast loop (BroadcastLoop::widen): each
/// holds its operand's row as often as a widened row needs, and the kernel reads it instead.
/// Lives on the calling thread's stack while the kernel's tasks run.
struct PeriodicRows {
  static constexpr int kMax = 4;
  alignas(64) std::array<std::array<float, static_cast<std::size_t>(fused_chunk)>, kMax> rows;

  /// Widens `loop` to rows of up to fused_chunk elements and points base[k] of every periodic
  /// operand k < operands at its copy. Operands in `no_periodic` (bit k) stay as they are.
  template <class Ptr>
  void Widen(BroadcastLoop& loop, Ptr* base, int operands, std::uint32_t no_periodic) {
    const std::int64_t inner = loop.inner;
    std::uint32_t periodic = 0;
    const std::int64_t factor = loop.widen(fused_chunk, no_periodic, kMax, periodic);
    std::size_t used = 0;
    for (int k = 0; k < operands && factor > 1; ++k) {
      if (!(periodic >> k & 1u)) continue;
      float* row = rows[used++].data();
      for (std::int64_t i = 0; i < factor; ++i) std::copy_n(base[k], inner, row + i * inner);
      base[k] = row;
    }
  }
};

template <Op op> void ElementwiseKernel(const KernelArgs& args) {
  const auto* s = std::get_if<ScalarAttrs>(args.attrs);
  const float scalar = s ? s->value : 0.0f;
  BroadcastLoop loop = LoopOf(args);
  const float* base[2] = {args.in[0].f32(), args.in[args.num_inputs > 1 ? 1 : 0].f32()};
  PeriodicRows periodic;
  periodic.Widen(loop, base, std::min(args.num_inputs, 2), 0);
  const int ib = args.num_inputs > 1 ? 1 : 0; // unary ops read their one input as both operands
  const RowFn row =
      RowTable()[op_index(op)][static_cast<std::size_t>(loop.inner_stride[0])]
                [static_cast<std::size_t>(loop.inner_stride[static_cast<std::size_t>(ib)])];
  const float* pa = base[0];
  const float* pb = base[ib];
  float* po = args.out.f32();
  ForEachChunk(loop, 4096, [&](std::int64_t r, std::int64_t first, std::int64_t n) {
    std::int64_t offsets[max_op_inputs];
    loop.row_offsets(r, offsets);
    const std::int64_t oa = offsets[0] + (loop.inner_stride[0] ? first : 0);
    const std::int64_t ob =
        offsets[ib] + (loop.inner_stride[static_cast<std::size_t>(ib)] ? first : 0);
    row(pa + oa, pb + ob, po + r * loop.inner + first, n, scalar);
  });
}

/// An elementwise program bound to the tensors of one kernel call: `base[k]` holds program
/// input k, every input broadcasting over `loop` (built from the output's shape first).
struct BoundProgram {
  const std::vector<FusedInstruction>* program = nullptr;
  const std::vector<FusedStore>* stores = nullptr;
  std::array<float*, max_op_inputs> base{};
  BroadcastLoop loop;
  float* out = nullptr;

  /// Runs every step over elements [first, first + n) of row r (n <= fused_chunk), the
  /// intermediate results in `temps` ((steps - 1) chunks), the last step into out, or into
  /// `result` when given. With `staged`, operand 0 (an anchor's result, the output's shape) is
  /// read from there instead: staged[i - staged_begin] holds flat element i.
  void RunPiece(std::int64_t r, std::int64_t first, std::int64_t n, float* temps,
                const float* staged = nullptr, std::int64_t staged_begin = 0,
                float* result = nullptr) const {
    const auto& rows = RowTable();
    const auto steps = static_cast<std::int64_t>(program->size());
    std::int64_t offsets[max_op_inputs];
    loop.row_offsets(r, offsets);
    float* row_out = result ? result : out + r * loop.inner + first;
    const auto operand = [&](int v, std::size_t& contiguous) -> const float* {
      if (v >= 0) {
        contiguous = 1;
        return temps + static_cast<std::int64_t>(v) * fused_chunk;
      }
      const auto k = static_cast<std::size_t>(-(v + 1));
      contiguous = static_cast<std::size_t>(loop.inner_stride[k]);
      if (k == 0 && staged) return staged + (r * loop.inner + first - staged_begin);
      return base[k] + offsets[k] + (contiguous ? first : 0);
    };
    for (std::int64_t k = 0; k < steps; ++k) {
      const FusedInstruction& f = (*program)[static_cast<std::size_t>(k)];
      std::size_t ca = 0, cb = 0;
      const float* a = operand(f.a, ca);
      const float* b = operand(f.b, cb);
      float* dst = k + 1 == steps ? row_out : temps + k * fused_chunk;
      rows[op_index(f.op)][ca][cb](a, b, dst, n, f.scalar);
    }
    // Stores go last: every step of this piece has read the params' old values by now.
    for (const FusedStore& st : *stores) {
      const auto k = static_cast<std::size_t>(st.input);
      const float* value = st.step + 1 == steps ? row_out : temps + st.step * fused_chunk;
      std::memcpy(base[k] + offsets[k] + first, value, static_cast<std::size_t>(n) * sizeof(float));
    }
  }

  /// Runs the program over the flat output elements [begin, end) on the calling thread,
  /// operand 0 read from `staged` (holding elements [begin, end)) when given.
  void RunRange(std::int64_t begin, std::int64_t end, float* temps,
                const float* staged = nullptr) const {
    for (std::int64_t at = begin; at < end;) {
      const std::int64_t r = at / loop.inner, first = at % loop.inner;
      const std::int64_t n = std::min({fused_chunk, loop.inner - first, end - at});
      RunPiece(r, first, n, temps, staged, begin);
      at += n;
    }
  }

  /// Runs the program over the flat elements [begin, end) into result[0, end - begin) instead
  /// of the output, on the calling thread (a program that stores nothing).
  void RunRangeInto(std::int64_t begin, std::int64_t end, float* temps, float* result) const {
    for (std::int64_t at = begin; at < end;) {
      const std::int64_t r = at / loop.inner, first = at % loop.inner;
      const std::int64_t n = std::min({fused_chunk, loop.inner - first, end - at});
      RunPiece(r, first, n, temps, nullptr, 0, result + (at - begin));
      at += n;
    }
  }
};

/// Bit k set for every program input k that a store writes: those must stay in place.
inline std::uint32_t StoredOperands(const std::vector<FusedStore>& stores) {
  std::uint32_t mask = 0;
  for (const FusedStore& st : stores) mask |= 1u << static_cast<unsigned>(st.input);
  return mask;
}

/// A fused chain: each chunk of a row goes through every step of the program, keeping the
/// intermediate results in this thread's workspace (a few KiB, so they stay in L1/L2).
inline void FusedElementwiseKernel(const KernelArgs& args) {
  const FusedAttrs& fused = *std::get_if<FusedAttrs>(args.attrs);
  BoundProgram bound{&fused.program, &fused.stores, {}, LoopOf(args), args.out.f32()};
  for (int k = 0; k < args.num_inputs; ++k)
    bound.base[static_cast<std::size_t>(k)] = args.in[static_cast<std::size_t>(k)].f32();
  PeriodicRows periodic;
  periodic.Widen(bound.loop, bound.base.data(), args.num_inputs, StoredOperands(fused.stores));
  ForEachChunk(bound.loop, fused_chunk, [&](std::int64_t r, std::int64_t first, std::int64_t n) {
    bound.RunPiece(r, first, n, ThreadScratch(args));
  });
}

/// An anchor's epilogue bound to its kernel call: program input 0 is the anchor's output
/// (rewritten in place), input k >= 1 the node's input anchor_arity + k - 1. Anchors call
/// it on each piece of output they finish, while that piece is still in cache.
class EpilogueRunner {
public:
  explicit EpilogueRunner(const KernelArgs& args) {
    const Epilogue* e = args.attrs ? epilogue_of(*args.attrs) : nullptr;
    if (!e || e->empty()) return;
    std::array<Shape, max_op_inputs> shapes{};
    shapes[0] = args.out.shape;
    bound_.base[0] = args.out.f32();
    const int operands = args.num_inputs - anchor_arity + 1;
    for (int k = 1; k < operands; ++k) {
      const auto& in = args.in[static_cast<std::size_t>(anchor_arity + k - 1)];
      shapes[static_cast<std::size_t>(k)] = in.shape;
      bound_.base[static_cast<std::size_t>(k)] = in.f32();
      needs_staging_ = needs_staging_ || in.data == args.out.data;
    }
    bound_.program = &e->program;
    bound_.stores = &e->stores;
    bound_.loop = BroadcastLoop(
        args.out.shape, std::span<const Shape>(shapes.data(), static_cast<std::size_t>(operands)));
    bound_.out = args.out.f32();
    // Operand 0, the anchor's result, may be read from a staging buffer: it stays in place.
    periodic_.Widen(bound_.loop, bound_.base.data(), operands, 1u | StoredOperands(e->stores));
  }

  // bound_ may point into periodic_: a copy would point into the original.
  EpilogueRunner(const EpilogueRunner&) = delete;
  EpilogueRunner& operator=(const EpilogueRunner&) = delete;

  [[nodiscard]] bool active() const { return bound_.program != nullptr; }
  /// Where an anchor writes its result for a piece of output before the epilogue runs: the
  /// output itself, or `staging` when the output took over an operand's memory
  /// (OpDef::overwritable_input), so that the operand is still there when the epilogue reads
  /// it. Pass the same pointer to operator().
  [[nodiscard]] float* result_target(float* output_piece, float* staging) const {
    return needs_staging_ ? staging : output_piece;
  }

  /// Applies the epilogue to output elements [begin, end); temps: epilogue_floats() floats.
  /// `result`, from result_target(), holds the anchor's result for those elements.
  void operator()(std::size_t begin, std::size_t end, float* temps,
                  const float* result = nullptr) const {
    if (active())
      bound_.RunRange(static_cast<std::int64_t>(begin), static_cast<std::int64_t>(end), temps,
                      needs_staging_ ? result : nullptr);
  }

private:
  BoundProgram bound_{nullptr, nullptr, {}, BroadcastLoop(Shape{}, {}), nullptr};
  PeriodicRows periodic_;
  bool needs_staging_ = false;
};

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
    table.add(Op::name, {spelling, &ElementwiseKernel<Op::name>});
  KILN_OP_LIST(KILN_REGISTER_ELEMENTWISE)
#undef KILN_REGISTER_ELEMENTWISE
  table.add(Op::Fill, {"fill", &FillKernel});
  table.add(Op::Assign, {"assign", &AssignKernel});
  table.add(Op::DropoutMask, {"dropout_mask", &DropoutMaskKernel});
  table.add(Op::FusedElementwise,
            {"fused_elementwise", &FusedElementwiseKernel, nullptr, &fused_workspace});
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
