// BatchLoader: seeded, reproducible shuffling and normalised mini-batches over a Dataset.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/rng.hpp"
#include "kiln/data/dataset.hpp"

namespace kiln::data {

/// Per-pixel normalisation applied by the loader: out = (x - mean) / std.
struct Normalization {
  float mean = 0.0f;
  float std = 1.0f;
};

/// No normalisation: pixels stay in [0, 1].
inline constexpr Normalization identity_normalization{0.0f, 1.0f};
/// The usual MNIST training-set statistics.
inline constexpr Normalization mnist_normalization{0.1307f, 0.3081f};
/// The usual Fashion-MNIST training-set statistics.
inline constexpr Normalization fashion_mnist_normalization{0.2860f, 0.3530f};

/// How a BatchLoader batches a dataset.
struct LoaderOptions {
  std::int64_t batch_size = 64;
  std::uint64_t seed = 0;
  bool shuffle = true;
  /// Skip the last batch when it would be partial (otherwise it is zero-padded).
  bool drop_last = false;
  Normalization normalization = identity_normalization;
  /// Data-parallel training: `ranks` processes share every batch. Each epoch's order is the
  /// same on every rank (it depends on seed and epoch only); batch b of the epoch is the
  /// samples [b·batch_size·ranks, (b+1)·batch_size·ranks) of it, and this rank fills share
  /// `rank` of those, batch_size samples. One rank: the whole batch.
  int rank = 0;
  int ranks = 1;
};

/// Hands out mini-batches of a Dataset, in a per-epoch order that depends only on
/// (seed, epoch), so a run can be reproduced or resumed at any epoch.
///
/// The loader holds a reference: the Dataset must outlive it. `fill` is const and writes
/// only to caller buffers, so batches of one epoch may be filled concurrently.
class BatchLoader {
public:
  /// Throws errc::argument when batch_size <= 0, std is not positive, or the dataset's
  /// arrays disagree with its count/height/width. Starts at epoch 0.
  BatchLoader(const Dataset& data, LoaderOptions options) : data_(data), opt_(options) {
    if (opt_.batch_size <= 0)
      fail(errc::argument,
           "BatchLoader: batch_size is " + std::to_string(opt_.batch_size) + ", expected > 0");
    if (opt_.ranks < 1 || opt_.rank < 0 || opt_.rank >= opt_.ranks)
      fail(errc::argument, "BatchLoader: rank " + std::to_string(opt_.rank) + " of " +
                               std::to_string(opt_.ranks) + " ranks");
    if (!(opt_.normalization.std > 0.0f))
      fail(errc::argument, "BatchLoader: normalization std is " +
                               std::to_string(opt_.normalization.std) + ", expected > 0");
    if (data.count < 0 || data.height <= 0 || data.width <= 0 ||
        data.images.size() != static_cast<std::size_t>(data.count * data.image_size()) ||
        data.labels.size() != static_cast<std::size_t>(data.count))
      fail(errc::argument, "BatchLoader: dataset arrays (" + std::to_string(data.images.size()) +
                               " pixels, " + std::to_string(data.labels.size()) +
                               " labels) do not match count " + std::to_string(data.count) +
                               " of " + std::to_string(data.height) + "x" +
                               std::to_string(data.width) + " images");
    start_epoch(0);
  }
  /// A loader over a temporary would dangle.
  BatchLoader(Dataset&&, LoaderOptions) = delete;

  /// Sets the sample order for `epoch`: a permutation that is a pure function of
  /// (seed, epoch) when shuffling, the dataset order otherwise.
  void start_epoch(int epoch) {
    order_.resize(static_cast<std::size_t>(data_.count));
    std::iota(order_.begin(), order_.end(), std::int64_t{0});
    if (!opt_.shuffle) return;
    // Mixing the epoch before combining keeps nearby (seed, epoch) pairs uncorrelated.
    Rng rng(mix64(opt_.seed ^ mix64(static_cast<std::uint64_t>(static_cast<std::int64_t>(epoch)))));
    for (std::size_t i = order_.size(); i > 1; --i) {
      const auto j = static_cast<std::size_t>(rng.below(i));
      std::swap(order_[i - 1], order_[j]);
    }
  }

  /// Batches per epoch: ceil(count / (batch_size·ranks)), or floor with drop_last.
  [[nodiscard]] std::int64_t batches() const {
    const std::int64_t global = opt_.batch_size * opt_.ranks;
    return opt_.drop_last ? data_.count / global : (data_.count + global - 1) / global;
  }
  [[nodiscard]] std::int64_t batch_size() const { return opt_.batch_size; }
  /// Floats `fill` expects in its images span: batch_size * 1 * height * width.
  [[nodiscard]] std::int64_t batch_image_elements() const {
    return opt_.batch_size * data_.image_size();
  }
  /// The current epoch's sample order (dataset indices).
  [[nodiscard]] std::span<const std::int64_t> order() const { return order_; }
  [[nodiscard]] const LoaderOptions& options() const { return opt_; }

  /// Writes this rank's share of batch `batch_index` of the current epoch as [batch_size, 1,
  /// height, width] normalised pixels and [batch_size] labels; returns how many samples are
  /// real (from 0 to batch_size). In a partial last batch the remaining rows are zeros with
  /// label 0.
  /// Throws errc::argument for a batch_index outside [0, batches()) or spans whose sizes
  /// differ from batch_image_elements() and batch_size().
  std::int64_t fill(std::int64_t batch_index, std::span<float> images,
                    std::span<std::int32_t> labels) const {
    if (batch_index < 0 || batch_index >= batches())
      fail(errc::argument, "BatchLoader::fill: batch_index " + std::to_string(batch_index) +
                               " outside [0, " + std::to_string(batches()) + ")");
    if (images.size() != static_cast<std::size_t>(batch_image_elements()))
      fail(errc::argument, "BatchLoader::fill: images span holds " + std::to_string(images.size()) +
                               " floats, expected " + std::to_string(batch_image_elements()));
    if (labels.size() != static_cast<std::size_t>(opt_.batch_size))
      fail(errc::argument, "BatchLoader::fill: labels span holds " + std::to_string(labels.size()) +
                               " values, expected " + std::to_string(opt_.batch_size));

    const std::int64_t first = (batch_index * opt_.ranks + opt_.rank) * opt_.batch_size;
    const std::int64_t real = std::clamp(data_.count - first, std::int64_t{0}, opt_.batch_size);
    const auto pixels = static_cast<std::size_t>(data_.image_size());
    const float mean = opt_.normalization.mean;
    const float scale_std = opt_.normalization.std;
    for (std::int64_t b = 0; b < real; ++b) {
      const auto sample = static_cast<std::size_t>(order_[static_cast<std::size_t>(first + b)]);
      const float* src = data_.images.data() + sample * pixels;
      float* dst = images.data() + static_cast<std::size_t>(b) * pixels;
      for (std::size_t p = 0; p < pixels; ++p) dst[p] = (src[p] - mean) / scale_std;
      labels[static_cast<std::size_t>(b)] = data_.labels[sample];
    }
    std::fill(images.begin() +
                  static_cast<std::ptrdiff_t>(real) * static_cast<std::ptrdiff_t>(pixels),
              images.end(), 0.0f);
    std::fill(labels.begin() + static_cast<std::ptrdiff_t>(real), labels.end(), 0);
    return real;
  }

private:
  const Dataset& data_;
  LoaderOptions opt_;
  std::vector<std::int64_t> order_;
};

} // namespace kiln::data
