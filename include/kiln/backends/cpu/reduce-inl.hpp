// Per-target reduce kernels: sum_to, and fused_sum_to, which sums an elementwise chain's result
// as it computes it; re-included once per Highway target by implementation.hpp.
#if defined(KILN_CPU_REDUCE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_REDUCE_INL_H_
#undef KILN_CPU_REDUCE_INL_H_
#else
#define KILN_CPU_REDUCE_INL_H_
#endif

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_reduce.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

#include "kiln/backends/cpu/elementwise-inl.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/variants.hpp"
#include "kiln/backends/cpu/workspace.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace reduce_detail {

/// Elements a parallel task should at least touch to pay for its scheduling.
inline constexpr std::int64_t kMinTaskElements = 32768;

/// Rows summed into a partial accumulator before it is folded into the total: two-level
/// summation keeps the float error of long reductions near sqrt(rows) instead of rows.
inline constexpr std::int64_t kPartialRows = 256;

/// A run of adjacent input dims of one kind merged into one: extent and element stride.
struct Axis {
  std::int64_t n = 1;
  std::int64_t stride = 0;
};

/// SumTo after dropping size-1 dims and merging neighbours of the same kind (reduced or
/// kept). Axes are listed outermost first and padded with {1, 0} up to three of each kind,
/// so the loops below have a fixed depth. `inner` is the innermost, contiguous, run.
struct SumToProblem {
  Axis kept[3];
  Axis reduced[3];
  std::int64_t inner = 1;
  bool inner_kept = false;
  bool any_reduced = false;
  bool any_kept = false;
};

/// Collapses sum_to(from -> to) into at most three kept and three reduced axes.
inline SumToProblem Collapse(const Shape& from, const Shape& to) {
  std::int64_t n[Shape::max_rank];
  bool red[Shape::max_rank];
  int m = 0;
  for (int i = 0; i < from.rank(); ++i) {
    if (from[i] == 1) continue;
    const bool r = to[i] == 1;
    if (m > 0 && red[m - 1] == r) {
      n[m - 1] *= from[i];
    } else {
      n[m] = from[i];
      red[m] = r;
      ++m;
    }
  }
  SumToProblem p;
  if (m == 0) return p;
  p.inner = n[m - 1];
  p.inner_kept = !red[m - 1];
  int nk = 0, nr = 0;
  std::int64_t stride = 1;
  // Walk inner to outer so strides accumulate; fill the padded arrays from the back so
  // the innermost listed axis stays last.
  Axis kept_rev[3], red_rev[3];
  for (int g = m - 1; g >= 0; --g) {
    if (red[g]) {
      p.any_reduced = true;
      if (g != m - 1) red_rev[nr++] = {n[g], stride};
    } else {
      p.any_kept = true;
      if (g != m - 1) kept_rev[nk++] = {n[g], stride};
    }
    stride *= n[g];
  }
  for (int i = 0; i < nk; ++i) p.kept[3 - nk + i] = kept_rev[nk - 1 - i];
  for (int i = 0; i < nr; ++i) p.reduced[3 - nr + i] = red_rev[nr - 1 - i];
  return p;
}

/// Input offset of the o-th combination of the three kept axes (row-major over them).
inline std::int64_t KeptOffset(const Axis* kept, std::int64_t o) {
  const std::int64_t i2 = o % kept[2].n;
  o /= kept[2].n;
  const std::int64_t i1 = o % kept[1].n;
  const std::int64_t i0 = o / kept[1].n;
  return i0 * kept[0].stride + i1 * kept[1].stride + i2 * kept[2].stride;
}

/// out[0, 4*Lanes(d)) = sum over the reduced rows of in[row + ...], the accumulators held in
/// registers for the whole reduction so `out` is written once.
template <class D> inline void SumColumns4(D d, const float* in, float* out, const Axis* red) {
  const std::size_t N = hn::Lanes(d);
  auto t0 = hn::Zero(d), t1 = hn::Zero(d), t2 = hn::Zero(d), t3 = hn::Zero(d);
  for (std::int64_t i0 = 0; i0 < red[0].n; ++i0) {
    for (std::int64_t i1 = 0; i1 < red[1].n; ++i1) {
      const float* base = in + i0 * red[0].stride + i1 * red[1].stride;
      for (std::int64_t c = 0; c < red[2].n; c += kPartialRows) {
        const std::int64_t end = std::min(red[2].n, c + kPartialRows);
        auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
        for (std::int64_t i2 = c; i2 < end; ++i2) {
          const float* p = base + i2 * red[2].stride;
          a0 = hn::Add(a0, hn::LoadU(d, p));
          a1 = hn::Add(a1, hn::LoadU(d, p + N));
          a2 = hn::Add(a2, hn::LoadU(d, p + 2 * N));
          a3 = hn::Add(a3, hn::LoadU(d, p + 3 * N));
        }
        t0 = hn::Add(t0, a0);
        t1 = hn::Add(t1, a1);
        t2 = hn::Add(t2, a2);
        t3 = hn::Add(t3, a3);
      }
    }
  }
  hn::StoreU(t0, d, out);
  hn::StoreU(t1, d, out + N);
  hn::StoreU(t2, d, out + 2 * N);
  hn::StoreU(t3, d, out + 3 * N);
}

/// As SumColumns4 for one vector of Lanes(d) columns (d may be a one-lane tag for tails).
template <class D> inline void SumColumns1(D d, const float* in, float* out, const Axis* red) {
  auto t = hn::Zero(d);
  for (std::int64_t i0 = 0; i0 < red[0].n; ++i0) {
    for (std::int64_t i1 = 0; i1 < red[1].n; ++i1) {
      const float* base = in + i0 * red[0].stride + i1 * red[1].stride;
      for (std::int64_t c = 0; c < red[2].n; c += kPartialRows) {
        const std::int64_t end = std::min(red[2].n, c + kPartialRows);
        auto a = hn::Zero(d);
        for (std::int64_t i2 = c; i2 < end; ++i2)
          a = hn::Add(a, hn::LoadU(d, base + i2 * red[2].stride));
        t = hn::Add(t, a);
      }
    }
  }
  hn::StoreU(t, d, out);
}

/// Sum of n contiguous floats.
inline float ContiguousSum(const float* p, std::int64_t n) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  std::int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    a0 = hn::Add(a0, hn::LoadU(d, p + i));
    a1 = hn::Add(a1, hn::LoadU(d, p + i + N));
    a2 = hn::Add(a2, hn::LoadU(d, p + i + 2 * N));
    a3 = hn::Add(a3, hn::LoadU(d, p + i + 3 * N));
  }
  for (; i + N <= n; i += N) a0 = hn::Add(a0, hn::LoadU(d, p + i));
  auto tail = hn::Zero(d1);
  for (; i < n; ++i) tail = hn::Add(tail, hn::LoadU(d1, p + i));
  const auto sum = hn::Add(hn::Add(a0, a1), hn::Add(a2, a3));
  return hn::GetLane(hn::SumOfLanes(d, sum)) + hn::GetLane(tail);
}

/// Sums one short output row over many rows (a bias gradient over an NHWC tensor): the rows
/// are cut into a fixed number of blocks summed in parallel, and the block sums are added in
/// block order, so the result does not depend on the thread count.
inline constexpr std::int64_t kColumnSumMaxWidth = 256;
inline void SumManyRows(const float* x, float* y, std::int64_t width, const Axis& rows) {
  constexpr std::int64_t blocks = 8;
  float partial[blocks][kColumnSumMaxWidth];
  tbb::parallel_for(std::int64_t{0}, blocks, [&](std::int64_t b) HWY_ATTR {
    const std::int64_t first = rows.n * b / blocks, last = rows.n * (b + 1) / blocks;
    const Axis block[3] = {{1, 0}, {1, 0}, {last - first, rows.stride}};
    const float* in = x + first * rows.stride;
    const hn::ScalableTag<float> d;
    const hn::CappedTag<float, 1> d1;
    const auto N = static_cast<std::int64_t>(hn::Lanes(d));
    std::int64_t c = 0;
    for (; c + 4 * N <= width; c += 4 * N) SumColumns4(d, in + c, partial[b] + c, block);
    for (; c + N <= width; c += N) SumColumns1(d, in + c, partial[b] + c, block);
    for (; c < width; ++c) SumColumns1(d1, in + c, partial[b] + c, block);
  });
  for (std::int64_t c = 0; c < width; ++c) {
    float sum = 0.0f;
    for (std::int64_t b = 0; b < blocks; ++b) sum += partial[b][c];
    y[c] = sum;
  }
}

/// Innermost run kept: each task sums one column tile of one output row over all reduced
/// rows, vectorised across the columns.
inline void SumToInnerKept(const float* x, float* y, const SumToProblem& p) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const auto N = static_cast<std::int64_t>(hn::Lanes(d));
  const std::int64_t K = p.inner;
  const std::int64_t tile = 4 * N;
  const std::int64_t tiles = (K + tile - 1) / tile;
  const std::int64_t rows_out = p.kept[0].n * p.kept[1].n * p.kept[2].n;
  const std::int64_t rows_in = p.reduced[0].n * p.reduced[1].n * p.reduced[2].n;
  if (rows_out == 1 && K <= kColumnSumMaxWidth && p.reduced[0].n * p.reduced[1].n == 1 &&
      rows_in * K >= 8 * kMinTaskElements) {
    SumManyRows(x, y, K, p.reduced[2]);
    return;
  }
  const std::int64_t grain = std::max<std::int64_t>(1, kMinTaskElements / (rows_in * tile));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, rows_out * tiles, grain),
                    [&](const tbb::blocked_range<std::int64_t>& r) HWY_ATTR {
                      for (std::int64_t item = r.begin(); item != r.end(); ++item) {
                        const std::int64_t o = item / tiles;
                        const std::int64_t c0 = (item % tiles) * tile;
                        const float* in = x + KeptOffset(p.kept, o);
                        float* out = y + o * K;
                        std::int64_t c = c0;
                        const std::int64_t end = std::min(K, c0 + tile);
                        if (end - c == tile) {
                          SumColumns4(d, in + c, out + c, p.reduced);
                          continue;
                        }
                        for (; c + N <= end; c += N) SumColumns1(d, in + c, out + c, p.reduced);
                        for (; c < end; ++c) SumColumns1(d1, in + c, out + c, p.reduced);
                      }
                    });
}

/// Innermost run reduced: each output element is a sum of contiguous runs.
inline void SumToInnerReduced(const float* x, float* y, const SumToProblem& p) {
  const std::int64_t R = p.inner;
  const std::int64_t outs = p.kept[0].n * p.kept[1].n * p.kept[2].n;
  const std::int64_t runs = p.reduced[0].n * p.reduced[1].n * p.reduced[2].n;
  const std::int64_t grain = std::max<std::int64_t>(1, kMinTaskElements / (runs * R));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, outs, grain),
                    [&](const tbb::blocked_range<std::int64_t>& r) HWY_ATTR {
                      for (std::int64_t o = r.begin(); o != r.end(); ++o) {
                        const float* in = x + KeptOffset(p.kept, o);
                        double sum = 0.0;
                        for (std::int64_t i0 = 0; i0 < p.reduced[0].n; ++i0)
                          for (std::int64_t i1 = 0; i1 < p.reduced[1].n; ++i1)
                            for (std::int64_t i2 = 0; i2 < p.reduced[2].n; ++i2)
                              sum += ContiguousSum(in + i0 * p.reduced[0].stride +
                                                       i1 * p.reduced[1].stride +
                                                       i2 * p.reduced[2].stride,
                                                   R);
                        y[o] = static_cast<float>(sum);
                      }
                    });
}

/// Everything reduced: the input is one contiguous run; chunks are summed in parallel and
/// combined in a fixed order so the result does not depend on the thread count.
inline void SumAll(const float* x, float* y, std::int64_t n) {
  const double sum = tbb::parallel_deterministic_reduce(
      tbb::blocked_range<std::int64_t>(0, n, kMinTaskElements), 0.0,
      [&](const tbb::blocked_range<std::int64_t>& r, double acc) HWY_ATTR {
        return acc + static_cast<double>(ContiguousSum(x + r.begin(), r.end() - r.begin()));
      },
      [](double a, double b) { return a + b; });
  *y = static_cast<float>(sum);
}

/// A fused_sum_to's chain bound to its call, with where each worker evaluates it: `temps` for
/// the chain's intermediate steps, `values` for one chunk of its result.
struct SummedChain {
  BoundProgram bound;
  PeriodicRows periodic;
  const KernelArgs* args = nullptr;

  explicit SummedChain(const KernelArgs& a)
      : bound{nullptr, nullptr, {}, BroadcastLoop(Shape{}, {}), nullptr}, args(&a) {
    const FusedSumAttrs& fused = *std::get_if<FusedSumAttrs>(a.attrs);
    std::array<Shape, max_op_inputs> shapes{};
    for (int k = 0; k < a.num_inputs; ++k) {
      shapes[static_cast<std::size_t>(k)] = a.in[static_cast<std::size_t>(k)].shape;
      bound.base[static_cast<std::size_t>(k)] = a.in[static_cast<std::size_t>(k)].f32();
    }
    bound.program = &fused.chain.program;
    bound.stores = &fused.chain.stores;
    bound.loop = BroadcastLoop(
        fused.chain.shape,
        std::span<const Shape>(shapes.data(), static_cast<std::size_t>(a.num_inputs)));
    periodic.Widen(bound.loop, bound.base.data(), a.num_inputs, 0);
  }
  // bound's operands may point into periodic: a copy would point into the original.
  SummedChain(const SummedChain&) = delete;
  SummedChain& operator=(const SummedChain&) = delete;

  /// The chain's result for flat elements [begin, end) (at most fused_chunk of them), in this
  /// worker's scratch.
  [[nodiscard]] const float* Values(std::int64_t begin, std::int64_t end) const {
    float* scratch = ThreadScratch(*args);
    float* values = scratch + fused_sum_values_offset(bound.program->size());
    bound.RunRangeInto(begin, end, scratch, values);
    return values;
  }
};

/// Innermost run kept and nothing else (per-channel sums of NHWC, bias gradients): rows of K
/// columns, cut into a fixed number of blocks by the shape alone, each summed piece by piece
/// (a piece's rows first, then into the block's total) and the blocks added in order, so the
/// result does not depend on the thread count.
inline void FusedSumColumns(const SummedChain& chain, float* y, std::int64_t width,
                            std::int64_t rows) {
  constexpr std::int64_t max_blocks = 8;
  const std::int64_t blocks =
      std::clamp<std::int64_t>(rows * width / kMinTaskElements, 1, max_blocks);
  const std::int64_t piece_rows = std::max<std::int64_t>(1, fused_chunk / width);
  float total[max_blocks][fused_sum_max_columns];
  tbb::parallel_for(std::int64_t{0}, blocks, [&](std::int64_t b) HWY_ATTR {
    const hn::ScalableTag<float> d;
    const hn::CappedTag<float, 1> d1;
    const auto N = static_cast<std::int64_t>(hn::Lanes(d));
    float piece[fused_sum_max_columns];
    std::fill_n(total[b], width, 0.0f);
    const std::int64_t first = rows * b / blocks, last = rows * (b + 1) / blocks;
    for (std::int64_t r = first; r < last; r += piece_rows) {
      const std::int64_t n = std::min(piece_rows, last - r);
      const float* values = chain.Values(r * width, (r + n) * width);
      const Axis along[3] = {{1, 0}, {1, 0}, {n, width}};
      std::int64_t c = 0;
      for (; c + 4 * N <= width; c += 4 * N) SumColumns4(d, values + c, piece + c, along);
      for (; c + N <= width; c += N) SumColumns1(d, values + c, piece + c, along);
      for (; c < width; ++c) SumColumns1(d1, values + c, piece + c, along);
      for (c = 0; c < width; ++c) total[b][c] += piece[c];
    }
  });
  for (std::int64_t c = 0; c < width; ++c) {
    float sum = 0.0f;
    for (std::int64_t b = 0; b < blocks; ++b) sum += total[b][c];
    y[c] = sum;
  }
}

/// Innermost run reduced (per-channel sums of NCHW, a sum of everything): each output sums
/// contiguous runs, chunk by chunk, in double; outputs in parallel, and a single output's
/// runs cut into fixed blocks added in order.
inline void FusedSumRuns(const SummedChain& chain, float* y, const SumToProblem& p) {
  const std::int64_t R = p.inner;
  const std::int64_t outs = p.kept[0].n * p.kept[1].n * p.kept[2].n;
  const std::int64_t runs = p.reduced[0].n * p.reduced[1].n * p.reduced[2].n;
  const auto sum_run = [&](std::int64_t at, std::int64_t end) HWY_ATTR {
    double sum = 0.0;
    for (; at < end; at += fused_chunk) {
      const std::int64_t stop = std::min(end, at + fused_chunk);
      sum += static_cast<double>(ContiguousSum(chain.Values(at, stop), stop - at));
    }
    return sum;
  };
  const auto run_start = [&](std::int64_t o, std::int64_t run) {
    const std::int64_t i2 = run % p.reduced[2].n, i1 = run / p.reduced[2].n % p.reduced[1].n;
    const std::int64_t i0 = run / (p.reduced[2].n * p.reduced[1].n);
    return KeptOffset(p.kept, o) + i0 * p.reduced[0].stride + i1 * p.reduced[1].stride +
           i2 * p.reduced[2].stride;
  };
  if (outs == 1) {
    // One output: blocks of whole chunks of its runs, fixed by the shape.
    const std::int64_t total = runs * R;
    *y = static_cast<float>(tbb::parallel_deterministic_reduce(
        tbb::blocked_range<std::int64_t>(0, total, kMinTaskElements), 0.0,
        [&](const tbb::blocked_range<std::int64_t>& r, double acc) HWY_ATTR {
          for (std::int64_t at = r.begin(); at < r.end();) {
            const std::int64_t run = at / R, end = std::min(r.end(), (run + 1) * R);
            const std::int64_t start = run_start(0, run) + at % R;
            acc += sum_run(start, start + (end - at));
            at = end;
          }
          return acc;
        },
        [](double a, double b) { return a + b; }));
    return;
  }
  const std::int64_t grain = std::max<std::int64_t>(1, kMinTaskElements / (runs * R));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, outs, grain),
                    [&](const tbb::blocked_range<std::int64_t>& r) HWY_ATTR {
                      for (std::int64_t o = r.begin(); o != r.end(); ++o) {
                        double sum = 0.0;
                        for (std::int64_t run = 0; run < runs; ++run) {
                          const std::int64_t start = run_start(o, run);
                          sum += sum_run(start, start + R);
                        }
                        y[o] = static_cast<float>(sum);
                      }
                    });
}

} // namespace reduce_detail

/// fused_sum_to: the chain's result summed over the axes where the output has extent 1, a
/// chunk at a time in each worker's scratch, never stored whole. fused_sum_accepts keeps it to
/// the shapes summed here: a few columns, or runs.
inline void FusedSumToKernel(const KernelArgs& args) {
  using namespace reduce_detail;
  const FusedSumAttrs& fused = *std::get_if<FusedSumAttrs>(args.attrs);
  float* y = args.out.f32();
  const std::int64_t n_in = fused.chain.shape.numel();
  if (n_in == 0) {
    std::fill(y, y + args.out.numel(), 0.0f);
    return;
  }
  const SummedChain chain(args);
  const SumToProblem p = Collapse(fused.chain.shape, fused.to);
  if (!p.any_reduced) {
    for (std::int64_t at = 0; at < n_in; at += fused_chunk) {
      const std::int64_t end = std::min(n_in, at + fused_chunk);
      std::copy_n(chain.Values(at, end), end - at, y + at);
    }
  } else if (p.inner_kept) {
    FusedSumColumns(chain, y, p.inner, n_in / p.inner);
  } else {
    FusedSumRuns(chain, y, p);
  }
}

/// sum_to: out = x summed over the axes where out has extent 1 and x does not.
inline void SumToKernel(const KernelArgs& args) {
  using namespace reduce_detail;
  const float* x = args.in[0].f32();
  float* y = args.out.f32();
  const std::int64_t n_in = args.in[0].numel();
  const std::int64_t n_out = args.out.numel();
  if (n_in == 0) {
    std::fill(y, y + n_out, 0.0f);
    return;
  }
  const SumToProblem p = Collapse(args.in[0].shape, args.out.shape);
  if (!p.any_reduced) {
    std::memcpy(y, x, static_cast<std::size_t>(n_out) * sizeof(float));
  } else if (!p.any_kept) {
    SumAll(x, y, n_in);
  } else if (p.inner_kept) {
    SumToInnerKept(x, y, p);
  } else {
    SumToInnerReduced(x, y, p);
  }
}

/// Puts this target's sum_to kernel into the table.
inline void RegisterReduceKernels(KernelTable& table) {
  table.add(Op::SumTo, {"sum_to", &SumToKernel});
  table.add(Op::FusedSumTo,
            {"fused_sum_to", &FusedSumToKernel, &fused_sum_accepts, &fused_sum_workspace});
}

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
