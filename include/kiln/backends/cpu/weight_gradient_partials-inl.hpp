// Per-target partial sums of a convolution's weight gradient over the batch, in a fixed
// partition and a fixed order, so a step's result depends on its thread count only, never on
// which thread took which image. Re-included per target.
#if defined(KILN_CPU_WEIGHT_GRADIENT_PARTIALS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_WEIGHT_GRADIENT_PARTIALS_INL_H_
#undef KILN_CPU_WEIGHT_GRADIENT_PARTIALS_INL_H_
#else
#define KILN_CPU_WEIGHT_GRADIENT_PARTIALS_INL_H_
#endif

#include <algorithm>
#include <cstddef>

#include <hwy/highway.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include "kiln/backends/cpu/elementwise-inl.hpp"
#include "kiln/backends/cpu/kernel_table.hpp"
#include "kiln/backends/cpu/workspace.hpp"

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {

/// The batch cut into one contiguous run of images per worker slot, each run summed in image
/// order into the partial dW at `offset` in its own slot's workspace slice (whichever thread
/// runs it), the runs then added in slot order: the deterministic mode of the established
/// frameworks, at the price of a static split of the batch. Each dW element is `values`
/// floats wide (lanes of vector sums, added together at the end).
struct PartialWeightGradients {
  const KernelArgs& args;
  std::size_t offset, values;
  std::size_t slices = static_cast<std::size_t>(tbb::this_task_arena::max_concurrency());

  [[nodiscard]] float* slice(std::size_t t) const {
    return reinterpret_cast<float*>(args.workspace) +
           t * (args.workspace_per_worker / sizeof(float)) + offset;
  }

  /// Zeroes the partials, then calls add_image(n, partial) for every image n < batch, the
  /// images of one run in order on one thread, into that run's partial.
  template <class AddImage>
  void Accumulate(std::size_t batch, std::size_t size, const AddImage& add_image) const {
    for (std::size_t t = 0; t < slices; ++t) std::fill_n(slice(t), size * values, 0.0f);
    const std::size_t runs = std::min(slices, batch);
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, runs, 1),
        [&](const tbb::blocked_range<std::size_t>& r) {
          for (std::size_t run = r.begin(); run < r.end(); ++run) {
            const std::size_t first = batch * run / runs, last = batch * (run + 1) / runs;
            for (std::size_t n = first; n < last; ++n) add_image(n, slice(run));
          }
        },
        tbb::simple_partitioner());
  }

  /// dw[i] = the sum over runs, in order, of the `values` floats of element at(i), for
  /// i < size; the epilogue (typically the optimizer update) runs over each block as it is
  /// done.
  template <class At>
  void SumInto(float* dw, std::size_t size, const At& at, const EpilogueRunner& epilogue,
               std::size_t temps) const {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, size, 4096),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t i = r.begin(); i < r.end(); ++i) {
                          const std::size_t first = at(i) * values;
                          float sum = 0.0f;
                          for (std::size_t t = 0; t < slices; ++t)
                            for (std::size_t l = 0; l < values; ++l) sum += slice(t)[first + l];
                          dw[i] = sum;
                        }
                        epilogue(r.begin(), r.end(), ThreadScratch(args) + temps);
                      });
  }
};

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
