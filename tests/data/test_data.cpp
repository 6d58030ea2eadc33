// Tests for the data module: IDX reader hardening, load_mnist, and BatchLoader.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "kiln/data/data.hpp"
#include "support/skip.hpp"

namespace fs = std::filesystem;
using kiln::data::BatchLoader;
using kiln::data::Dataset;
using kiln::data::LoaderOptions;
using kiln::data::Split;

namespace {

/// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path_ = fs::temp_directory_path() /
            ("kiln_test_data_" + std::to_string(stamp) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

private:
  fs::path path_;
};

using IdxBytes = std::vector<std::uint8_t>;

/// An IDX header (type byte, rank from dims.size(), big-endian dims) followed by `payload`.
IdxBytes idx_bytes(std::vector<std::uint32_t> dims, const IdxBytes& payload,
                   std::uint8_t type = 0x08) {
  IdxBytes out = {0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8)
      out.push_back(static_cast<std::uint8_t>(d >> shift));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

IdxBytes iota_bytes(std::size_t n, std::uint8_t start = 0) {
  IdxBytes b(n);
  std::uint8_t next = start;
  for (std::uint8_t& v : b) v = next++;
  return b;
}

void write_plain(const fs::path& path, const IdxBytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

void write_gz(const fs::path& path, const IdxBytes& bytes) {
  gzFile gz = gzopen(path.c_str(), "wb");
  REQUIRE(gz != nullptr);
  if (!bytes.empty())
    REQUIRE(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())) ==
            static_cast<int>(bytes.size()));
  REQUIRE(gzclose(gz) == Z_OK);
}

IdxBytes file_bytes(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return IdxBytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

/// Runs `fn`, requires a kiln::Error with `code` whose message contains `needle`.
void check_error(const std::function<void()>& fn, std::string_view code,
                 const std::string& needle) {
  bool thrown = false;
  try {
    fn();
  } catch (const kiln::Error& e) {
    thrown = true;
    CHECK(e.code() == std::string(code));
    INFO((std::string("message: ") + e.what()));
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
  CHECK_MESSAGE(thrown, (std::string("expected kiln::Error ") + std::string(code)));
}

void check_idx_error(const fs::path& path, std::string_view code, const std::string& needle = "") {
  check_error([&] { (void)kiln::data::read_idx(path); }, code,
              needle.empty() ? path.filename().string() : needle);
}

/// A dataset whose sample i has every pixel equal to i / 255 and label i % 10, so a batch
/// row reveals which sample it came from.
Dataset numbered_dataset(std::int64_t count, std::int64_t h = 2, std::int64_t w = 3) {
  Dataset ds;
  ds.count = count;
  ds.height = h;
  ds.width = w;
  for (std::int64_t i = 0; i < count; ++i) {
    for (std::int64_t p = 0; p < h * w; ++p) ds.images.push_back(static_cast<float>(i) / 255.0f);
    ds.labels.push_back(static_cast<std::int32_t>(i % 10));
  }
  return ds;
}

std::vector<std::int64_t> epoch_order(BatchLoader& loader, int epoch) {
  loader.start_epoch(epoch);
  return {loader.order().begin(), loader.order().end()};
}

/// Writes an MNIST-style split (images [n,h,w], labels [n]) into dir.
void write_split(const TempDir& dir, const std::string& prefix, std::uint32_t n,
                 const IdxBytes& labels, bool gz = false) {
  const std::string suffix = gz ? ".gz" : "";
  const auto write = gz ? write_gz : write_plain;
  write(dir / (prefix + "-images-idx3-ubyte" + suffix), idx_bytes({n, 2, 2}, iota_bytes(n * 4)));
  write(dir / (prefix + "-labels-idx1-ubyte" + suffix),
        idx_bytes({static_cast<std::uint32_t>(labels.size())}, labels));
}

} // namespace

TEST_CASE("read_idx: plain file round-trip") {
  TempDir dir;
  const auto path = dir / "a-idx3-ubyte";
  write_plain(path, idx_bytes({3, 2, 2}, iota_bytes(12, 7)));
  const auto arr = kiln::data::read_idx(path);
  CHECK(arr.dims == kiln::Shape{3, 2, 2});
  CHECK(arr.data == iota_bytes(12, 7));
}

TEST_CASE("read_idx: gzip file round-trip, detected by content not name") {
  TempDir dir;
  const IdxBytes payload = iota_bytes(5 * 4 * 3 * 2, 1);
  const auto gz_named = dir / "b.gz";
  const auto gz_unnamed = dir / "b-idx4-ubyte";
  write_gz(gz_named, idx_bytes({5, 4, 3, 2}, payload));
  write_gz(gz_unnamed, idx_bytes({5, 4, 3, 2}, payload));
  for (const auto& path : {gz_named, gz_unnamed}) {
    const auto arr = kiln::data::read_idx(path);
    CHECK(arr.dims == kiln::Shape{5, 4, 3, 2});
    CHECK(arr.data == payload);
  }
  const auto rank1 = dir / "labels.gz";
  write_gz(rank1, idx_bytes({4}, {0, 1, 2, 3}));
  CHECK(kiln::data::read_idx(rank1).data == IdxBytes{0, 1, 2, 3});
}

TEST_CASE("read_idx: truncated files") {
  TempDir dir;
  SUBCASE("plain payload short") {
    const auto path = dir / "short-payload";
    write_plain(path, idx_bytes({3, 2, 2}, iota_bytes(11)));
    check_idx_error(path, kiln::errc::truncated);
  }
  SUBCASE("plain header short") {
    const auto path = dir / "short-header";
    IdxBytes b = idx_bytes({3, 2, 2}, {});
    b.resize(9);
    write_plain(path, b);
    check_idx_error(path, kiln::errc::truncated);
  }
  SUBCASE("empty file") {
    const auto path = dir / "empty";
    write_plain(path, {});
    check_idx_error(path, kiln::errc::truncated);
  }
  SUBCASE("gzip payload short") {
    const auto path = dir / "short.gz";
    write_gz(path, idx_bytes({3, 2, 2}, iota_bytes(10)));
    check_idx_error(path, kiln::errc::truncated);
  }
  SUBCASE("gzip header short") {
    const auto path = dir / "short-header.gz";
    write_gz(path, {0, 0, 8, 3, 0, 0});
    check_idx_error(path, kiln::errc::truncated);
  }
  SUBCASE("gzip stream cut off") {
    // Pseudo-random bytes do not compress, so cutting the file cuts the payload itself.
    IdxBytes payload(64 * 1024);
    std::uint32_t x = 12345;
    for (auto& v : payload) {
      x = x * 1664525u + 1013904223u;
      v = static_cast<std::uint8_t>(x >> 24);
    }
    const auto full = dir / "full.gz";
    write_gz(full, idx_bytes({64, 1024}, payload));
    IdxBytes compressed = file_bytes(full);
    REQUIRE(compressed.size() > 1000);
    compressed.resize(compressed.size() / 2);
    const auto path = dir / "cut.gz";
    write_plain(path, compressed);
    check_idx_error(path, kiln::errc::truncated);
  }
}

TEST_CASE("read_idx: corrupt gzip data") {
  TempDir dir;
  const auto full = dir / "ok.gz";
  write_gz(full, idx_bytes({100, 100}, IdxBytes(10000, 3)));
  IdxBytes compressed = file_bytes(full);
  REQUIRE(compressed.size() > 30);
  // Past the 10-byte gzip header: damages the deflate stream or its CRC trailer.
  for (std::size_t i = 12; i < compressed.size(); ++i) compressed[i] ^= 0x5a;
  const auto path = dir / "corrupt.gz";
  write_plain(path, compressed);
  bool thrown = false;
  try {
    (void)kiln::data::read_idx(path);
  } catch (const kiln::Error& e) {
    thrown = true;
    const bool known = e.code() == std::string(kiln::errc::format) ||
                       e.code() == std::string(kiln::errc::truncated);
    CHECK_MESSAGE(known, std::string(e.what()));
    CHECK(std::string(e.what()).find("corrupt.gz") != std::string::npos);
  }
  CHECK(thrown);
}

TEST_CASE("read_idx: trailing bytes after the payload") {
  TempDir dir;
  const auto plain = dir / "extra";
  write_plain(plain, idx_bytes({2, 2}, iota_bytes(5)));
  check_idx_error(plain, kiln::errc::format);
  const auto gz = dir / "extra.gz";
  write_gz(gz, idx_bytes({2, 2}, iota_bytes(5)));
  check_idx_error(gz, kiln::errc::format);
}

TEST_CASE("read_idx: wrong magic") {
  TempDir dir;
  const auto path = dir / "not-idx";
  write_plain(path, {0x12, 0x34, 0x08, 0x01, 0, 0, 0, 1, 5});
  check_idx_error(path, kiln::errc::magic);
  const auto gz = dir / "not-idx.gz";
  write_gz(gz, {'h', 'e', 'l', 'l', 'o'});
  check_idx_error(gz, kiln::errc::magic);
}

TEST_CASE("read_idx: bad header fields") {
  TempDir dir;
  SUBCASE("oversized dimension") {
    const auto path = dir / "huge";
    write_plain(path, idx_bytes({60000, 0xFFFFFFFFu, 28}, iota_bytes(16)));
    check_idx_error(path, kiln::errc::format, "dimension 1 is 4294967295");
    check_idx_error(path, kiln::errc::format, "huge");
  }
  SUBCASE("oversized dimension, gzip") {
    const auto path = dir / "huge.gz";
    write_gz(path, idx_bytes({0xFFFFFFFFu}, iota_bytes(16)));
    check_idx_error(path, kiln::errc::format, "dimension 0 is 4294967295");
  }
  SUBCASE("product over the limit from modest dimensions") {
    const auto path = dir / "product";
    write_plain(path, idx_bytes({40000, 40000, 2}, iota_bytes(16)));
    check_idx_error(path, kiln::errc::format, "dimension 2 is 2");
  }
  SUBCASE("all dimensions at the u32 maximum") {
    const auto path = dir / "max4";
    write_plain(path, idx_bytes({0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, {}));
    check_idx_error(path, kiln::errc::format, "dimension 0 is 4294967295");
  }
  SUBCASE("claim fits the limit but not the file") {
    const auto path = dir / "claims-more";
    write_plain(path, idx_bytes({1000, 1000}, iota_bytes(16)));
    check_idx_error(path, kiln::errc::truncated, "needs 1000012 bytes, file holds 28 bytes");
  }
  SUBCASE("zero dimension") {
    const auto path = dir / "zero";
    write_plain(path, idx_bytes({3, 0, 2}, {}));
    check_idx_error(path, kiln::errc::format, "dimension 1 is 0");
  }
  SUBCASE("rank 0") {
    const auto path = dir / "rank0";
    write_plain(path, idx_bytes({}, {}));
    check_idx_error(path, kiln::errc::format, "rank is 0");
  }
  SUBCASE("rank 5") {
    const auto path = dir / "rank5";
    write_plain(path, idx_bytes({1, 1, 1, 1, 1}, {7}));
    check_idx_error(path, kiln::errc::format, "rank is 5");
  }
  SUBCASE("element type other than u8") {
    const auto path = dir / "floats";
    write_plain(path, idx_bytes({1}, {0, 0, 0, 0}, 0x0D));
    check_idx_error(path, kiln::errc::format, "0x0d");
  }
}

TEST_CASE("read_idx: unreadable paths") {
  TempDir dir;
  check_idx_error(dir / "does-not-exist", kiln::errc::io);
  check_idx_error(dir.path(), kiln::errc::io, dir.path().string());
}

TEST_CASE("load_mnist: plain and gzip splits") {
  TempDir dir;
  write_split(dir, "train", 4, {0, 9, 3, 4});
  write_split(dir, "t10k", 2, {5, 6}, /*gz=*/true);

  const Dataset train = kiln::data::load_mnist(dir.path(), Split::train);
  CHECK(train.count == 4);
  CHECK(train.height == 2);
  CHECK(train.width == 2);
  CHECK(train.num_classes == 10);
  CHECK(train.labels == std::vector<std::int32_t>{0, 9, 3, 4});
  REQUIRE(train.images.size() == 16);
  CHECK(train.images[5] == doctest::Approx(5.0f / 255.0f));

  const Dataset test = kiln::data::load_mnist(dir.path(), Split::test);
  CHECK(test.count == 2);
  CHECK(test.labels == std::vector<std::int32_t>{5, 6});
  CHECK(test.images.size() == 8);
}

TEST_CASE("load_mnist: inconsistent files") {
  TempDir dir;
  SUBCASE("label out of range") {
    write_split(dir, "train", 3, {1, 2, 10});
    check_error([&] { (void)kiln::data::load_mnist(dir.path(), Split::train); }, kiln::errc::label,
                "train-labels-idx1-ubyte: label 2 is 10");
  }
  SUBCASE("image and label counts differ") {
    write_split(dir, "train", 3, {1, 2});
    try {
      (void)kiln::data::load_mnist(dir.path(), Split::train);
      FAIL("expected kiln::Error");
    } catch (const kiln::Error& e) {
      CHECK(e.code() == std::string(kiln::errc::format));
      const std::string msg = e.what();
      CHECK(msg.find("train-images-idx3-ubyte") != std::string::npos);
      CHECK(msg.find("train-labels-idx1-ubyte") != std::string::npos);
    }
  }
  SUBCASE("images not rank 3") {
    write_plain(dir / "train-images-idx3-ubyte", idx_bytes({3, 4}, iota_bytes(12)));
    write_plain(dir / "train-labels-idx1-ubyte", idx_bytes({3}, {0, 1, 2}));
    check_error([&] { (void)kiln::data::load_mnist(dir.path(), Split::train); }, kiln::errc::format,
                "train-images-idx3-ubyte");
  }
  SUBCASE("labels not rank 1") {
    write_plain(dir / "train-images-idx3-ubyte", idx_bytes({2, 2, 2}, iota_bytes(8)));
    write_plain(dir / "train-labels-idx1-ubyte", idx_bytes({2, 1}, {0, 1}));
    check_error([&] { (void)kiln::data::load_mnist(dir.path(), Split::train); }, kiln::errc::format,
                "train-labels-idx1-ubyte");
  }
  SUBCASE("damaged file inside the directory") {
    write_split(dir, "train", 3, {1, 2, 3});
    write_plain(dir / "train-images-idx3-ubyte", idx_bytes({3, 2, 2}, iota_bytes(5)));
    check_error([&] { (void)kiln::data::load_mnist(dir.path(), Split::train); },
                kiln::errc::truncated, "train-images-idx3-ubyte");
  }
}

TEST_CASE("load_mnist: missing data says how to fetch it") {
  TempDir dir;
  check_error([&] { (void)kiln::data::load_mnist(dir / "nowhere", Split::train); },
              kiln::errc::missing_data, "scripts/fetch_mnist.sh");
  check_error([&] { (void)kiln::data::load_mnist(dir / "nowhere", Split::test); },
              kiln::errc::missing_data, "/usr/share/datasets/fashion-mnist");
  // Images present, labels absent.
  write_plain(dir / "t10k-images-idx3-ubyte", idx_bytes({1, 2, 2}, iota_bytes(4)));
  check_error([&] { (void)kiln::data::load_mnist(dir.path(), Split::test); },
              kiln::errc::missing_data, "t10k-labels-idx1-ubyte");
  check_error([&] { (void)kiln::data::load_mnist(dir.path(), Split::train); },
              kiln::errc::missing_data, "fetch_mnist.sh");
}

TEST_CASE("BatchLoader: seeded shuffling") {
  const Dataset ds = numbered_dataset(100);
  BatchLoader a(ds, {.batch_size = 8, .seed = 42});
  BatchLoader b(ds, {.batch_size = 8, .seed = 42});
  BatchLoader other_seed(ds, {.batch_size = 8, .seed = 43});

  const auto a0 = epoch_order(a, 0);
  const auto a1 = epoch_order(a, 1);
  CHECK(a0 == epoch_order(b, 0));
  CHECK(a1 == epoch_order(b, 1));
  CHECK(a0 != a1);
  CHECK(a0 != epoch_order(other_seed, 0));
  // A pure function of (seed, epoch): revisiting an epoch gives the same order.
  CHECK(epoch_order(a, 0) == a0);

  std::vector<std::int64_t> identity(100);
  for (std::int64_t i = 0; i < 100; ++i) identity[static_cast<std::size_t>(i)] = i;
  CHECK(a0 != identity);
  for (auto order : {a0, a1}) {
    std::sort(order.begin(), order.end());
    CHECK(order == identity);
  }

  BatchLoader sequential(ds, {.batch_size = 8, .seed = 42, .shuffle = false});
  CHECK(epoch_order(sequential, 3) == identity);
}

TEST_CASE("BatchLoader: every sample exactly once per epoch, padded last batch") {
  const Dataset ds = numbered_dataset(10);
  BatchLoader loader(ds, {.batch_size = 4, .seed = 7});
  REQUIRE(loader.batches() == 3);
  REQUIRE(loader.batch_image_elements() == 4 * 6);

  for (int epoch = 0; epoch < 3; ++epoch) {
    loader.start_epoch(epoch);
    std::vector<float> images(static_cast<std::size_t>(loader.batch_image_elements()), -1.0f);
    std::vector<std::int32_t> labels(4, -1);
    std::vector<std::int64_t> seen;
    for (std::int64_t b = 0; b < loader.batches(); ++b) {
      const std::int64_t real = loader.fill(b, images, labels);
      CHECK(real == (b < 2 ? 4 : 2));
      for (std::int64_t r = 0; r < real; ++r) {
        const auto row = static_cast<std::size_t>(r);
        const auto sample = static_cast<std::int64_t>(std::lround(images[row * 6] * 255.0f));
        CHECK(labels[row] == sample % 10);
        CHECK(images[row * 6 + 5] == images[row * 6]);
        seen.push_back(sample);
      }
      if (real < 4) {
        for (std::size_t i = static_cast<std::size_t>(real) * 6; i < images.size(); ++i)
          CHECK(images[i] == 0.0f);
        for (std::size_t i = static_cast<std::size_t>(real); i < labels.size(); ++i)
          CHECK(labels[i] == 0);
      }
    }
    std::sort(seen.begin(), seen.end());
    CHECK(seen == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  }
}

TEST_CASE("BatchLoader: drop_last skips the partial batch") {
  const Dataset ds = numbered_dataset(10);
  BatchLoader loader(ds, {.batch_size = 4, .drop_last = true});
  CHECK(loader.batches() == 2);
  std::vector<float> images(24);
  std::vector<std::int32_t> labels(4);
  CHECK(loader.fill(1, images, labels) == 4);
  check_error([&] { (void)loader.fill(2, images, labels); }, kiln::errc::argument, "batch_index 2");

  BatchLoader exact(ds, {.batch_size = 5, .drop_last = true});
  CHECK(exact.batches() == 2);
}

TEST_CASE("BatchLoader: normalisation") {
  const Dataset ds = numbered_dataset(4, 1, 1);
  BatchLoader loader(
      ds, {.batch_size = 4, .shuffle = false, .normalization = kiln::data::mnist_normalization});
  std::vector<float> images(4);
  std::vector<std::int32_t> labels(4);
  REQUIRE(loader.fill(0, images, labels) == 4);
  for (int i = 0; i < 4; ++i)
    CHECK(images[static_cast<std::size_t>(i)] ==
          doctest::Approx((static_cast<float>(i) / 255.0f - 0.1307f) / 0.3081f));

  Dataset half = numbered_dataset(1, 1, 1);
  half.images[0] = 1.0f;
  BatchLoader one(half, {.batch_size = 1, .normalization = {0.5f, 0.25f}});
  std::vector<float> px(1);
  std::vector<std::int32_t> lb(1);
  one.fill(0, px, lb);
  CHECK(px[0] == doctest::Approx(2.0f));
  CHECK(kiln::data::fashion_mnist_normalization.mean == doctest::Approx(0.2860f));
  CHECK(kiln::data::fashion_mnist_normalization.std == doctest::Approx(0.3530f));
}

TEST_CASE("BatchLoader: argument validation") {
  const Dataset ds = numbered_dataset(10);
  check_error([&] { BatchLoader bad(ds, {.batch_size = 0}); }, kiln::errc::argument, "batch_size");
  check_error(
      [&] {
        BatchLoader bad(ds, {.normalization = {0.0f, 0.0f}});
      },
      kiln::errc::argument, "std");
  Dataset broken = numbered_dataset(10);
  broken.labels.pop_back();
  check_error([&] { BatchLoader bad(broken, {}); }, kiln::errc::argument, "labels");

  BatchLoader loader(ds, {.batch_size = 4});
  std::vector<float> images(24);
  std::vector<std::int32_t> labels(4);
  std::vector<float> small_images(23);
  std::vector<std::int32_t> small_labels(3);
  check_error([&] { (void)loader.fill(0, small_images, labels); }, kiln::errc::argument,
              "images span");
  check_error([&] { (void)loader.fill(0, images, small_labels); }, kiln::errc::argument,
              "labels span");
  check_error([&] { (void)loader.fill(-1, images, labels); }, kiln::errc::argument, "batch_index");
}

TEST_CASE("load_mnist: Fashion-MNIST from the system package") {
  const fs::path dir = kiln::data::fashion_mnist_system_dir;
  std::error_code ec;
  if (!fs::exists(dir / "t10k-images-idx3-ubyte.gz", ec)) {
    kiln::test::skip(dir.string() +
                     " absent (apt-get install dataset-fashion-mnist to run this test)");
    return;
  }
  const Dataset test = kiln::data::load_mnist(dir, Split::test);
  CHECK(test.count == 10000);
  CHECK(test.height == 28);
  CHECK(test.width == 28);
  CHECK(test.images.size() == 10000u * 28u * 28u);
  CHECK(test.labels.size() == 10000u);
  std::vector<int> per_class(10, 0);
  const bool in_range = std::all_of(test.labels.begin(), test.labels.end(),
                                    [](std::int32_t l) { return l >= 0 && l < 10; });
  REQUIRE(in_range);
  for (std::int32_t l : test.labels) ++per_class[static_cast<std::size_t>(l)];
  // Fashion-MNIST's test split is balanced: 1,000 of each class.
  for (int c : per_class) CHECK(c == 1000);
  const auto [lo, hi] = std::minmax_element(test.images.begin(), test.images.end());
  CHECK(*lo == 0.0f);
  CHECK(*hi == 1.0f);
}

TEST_CASE("load_mnist: MNIST built by scripts/fetch_mnist.sh") {
  // The environment's KILN_MNIST_DIR first, then the build's.
  std::vector<fs::path> candidates = {KILN_MNIST_DIR};
  if (const char* env = std::getenv("KILN_MNIST_DIR")) candidates.insert(candidates.begin(), env);
  std::error_code ec;
  const auto found = std::find_if(candidates.begin(), candidates.end(), [&](const fs::path& d) {
    return fs::exists(d / "t10k-labels-idx1-ubyte", ec);
  });
  if (found == candidates.end()) {
    kiln::test::skip("no MNIST IDX files in " + candidates.back().string() +
                     " (run scripts/fetch_mnist.sh to build them)");
    return;
  }
  for (Split split : {Split::train, Split::test}) {
    const Dataset ds = kiln::data::load_mnist(*found, split);
    CHECK(ds.count > 0);
    CHECK(ds.height == 28);
    CHECK(ds.width == 28);
    CHECK(ds.images.size() == static_cast<std::size_t>(ds.count) * 28u * 28u);
    const std::string note = found->string() + (split == Split::train ? " train: " : " test: ") +
                             std::to_string(ds.count) + " images";
    MESSAGE(note);
  }
}

TEST_CASE("read_idx: a FIFO named like an IDX file is refused at once, never waited on") {
  TempDir dir;
  const auto path = dir / "train-images-idx3-ubyte";
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  check_idx_error(path, kiln::errc::io, "is not a regular file");
}

TEST_CASE("read_idx: a gzip stream must end with its trailer, and nothing may follow it") {
  TempDir dir;
  const auto full = dir / "ok.gz";
  write_gz(full, idx_bytes({100, 100}, iota_bytes(10000)));
  const IdxBytes compressed = file_bytes(full);
  REQUIRE(compressed.size() > 8);
  SUBCASE("the 8-byte trailer (CRC and length) cut off") {
    IdxBytes cut(compressed.begin(), compressed.end() - 8);
    write_plain(dir / "cut.gz", cut);
    check_idx_error(dir / "cut.gz", kiln::errc::truncated, "cut off before its trailer");
  }
  SUBCASE("a flipped bit in the CRC") {
    IdxBytes flipped = compressed;
    flipped[flipped.size() - 8] ^= 0x01;
    write_plain(dir / "crc.gz", flipped);
    check_idx_error(dir / "crc.gz", kiln::errc::format, "corrupt gzip data");
  }
  SUBCASE("junk after the stream") {
    IdxBytes junk = compressed;
    for (const char c : std::string("junk")) junk.push_back(static_cast<std::uint8_t>(c));
    write_plain(dir / "junk.gz", junk);
    check_idx_error(dir / "junk.gz", kiln::errc::format, "data after the end of the gzip stream");
  }
  SUBCASE("a second gzip member after the first") {
    IdxBytes twice = compressed;
    twice.insert(twice.end(), compressed.begin(), compressed.end());
    write_plain(dir / "twice.gz", twice);
    check_idx_error(dir / "twice.gz", kiln::errc::format, "data after the end of the gzip stream");
  }
  SUBCASE("the whole stream is read") {
    const kiln::data::IdxArray a = kiln::data::read_idx(full);
    CHECK(a.data == iota_bytes(10000));
  }
}

TEST_CASE("read_idx: the caller caps the decompressed payload before it is read") {
  TempDir dir;
  const auto path = dir / "big.gz";
  write_gz(path, idx_bytes({100, 100}, IdxBytes(10000, 0)));
  check_error([&] { (void)kiln::data::read_idx(path, 4096); }, kiln::errc::format,
              "payload exceeds the 4096-byte limit");
  CHECK(kiln::data::read_idx(path, 10000).data.size() == 10000);
}
