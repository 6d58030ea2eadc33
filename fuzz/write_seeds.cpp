// Writes the fuzzers' seed corpus: valid inputs of every kind each reader accepts, from which
// libFuzzer mutates. `write_seeds DIR` fills DIR/idx and DIR/checkpoint.
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint_tensors.hpp"
#include "kiln/train/checkpoint.hpp"

namespace {

/// An IDX file of unsigned bytes with dimensions `dims` and element i = i * 37 mod 256.
std::vector<char> idx_bytes(const std::vector<std::uint32_t>& dims) {
  std::vector<char> out = {0, 0, 0x08, static_cast<char>(dims.size())};
  std::size_t count = 1;
  for (std::uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(d >> shift));
    count *= d;
  }
  for (std::size_t i = 0; i < count; ++i) out.push_back(static_cast<char>(i * 37 % 256));
  return out;
}

void write_plain(const std::filesystem::path& p, const std::vector<char>& bytes) {
  std::ofstream(p, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void write_gzip(const std::filesystem::path& p, const std::vector<char>& bytes) {
  gzFile f = gzopen(p.c_str(), "wb9");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_seeds DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir / "idx");
  std::filesystem::create_directories(dir / "checkpoint");
  write_plain(dir / "idx" / "labels", idx_bytes({10}));
  write_plain(dir / "idx" / "images", idx_bytes({3, 4, 4}));
  write_gzip(dir / "idx" / "images.gz", idx_bytes({3, 4, 4}));
  write_gzip(dir / "idx" / "rank4.gz", idx_bytes({2, 1, 3, 3}));
  const auto state = kiln::fuzz::checkpoint_tensors();
  kiln::save_checkpoint(dir / "checkpoint" / "plain.safetensors", state, {});
  kiln::save_checkpoint(
      dir / "checkpoint" / "position.safetensors", state,
      {.step = 12, .epoch = 1, .batch = 3, .seed = 42, .metadata = {{"model", "m"}}});
  return 0;
}
