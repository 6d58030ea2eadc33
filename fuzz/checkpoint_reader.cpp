// libFuzzer harness: any bytes given to the checkpoint reader either load (names, dtypes,
// shapes and checksum all matching) or end in a kiln::Error that leaves every tensor as it
// was; never a crash, a hang or another exception. The same holds when only some of the
// tensors are asked for (CheckpointLoad::skip_unlisted) and for the header alone
// (read_checkpoint_info). scripts/fuzz.sh builds and runs it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "checkpoint_tensors.hpp"
#include "fuzz_file.hpp"
#include "kiln/train/checkpoint.hpp"

namespace {

std::vector<std::byte> bytes_of(const std::vector<kiln::nn::Parameter>& state) {
  std::vector<std::byte> all;
  for (const auto& p : state) {
    const auto* first = static_cast<const std::byte*>(p.tensor->data());
    all.insert(all.end(), first,
               first + p.tensor->numel() *
                           static_cast<std::int64_t>(kiln::dtype_size(p.tensor->dtype())));
  }
  return all;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<kiln::nn::Parameter> state = kiln::fuzz::checkpoint_tensors();
  const std::vector<kiln::nn::Parameter> some(state.begin() + 1, state.end());
  const std::vector<std::byte> before = bytes_of(state);
  const auto file = kiln::fuzz::as_file(data, size);
  try {
    (void)kiln::load_checkpoint(file, state);
  } catch (const kiln::Error&) {
    if (bytes_of(state) != before) std::abort(); // a refused file must not touch the tensors
  }
  const std::vector<std::byte> loaded = bytes_of(state);
  try {
    (void)kiln::load_checkpoint(file, some, {.skip_unlisted = true});
  } catch (const kiln::Error&) {
    if (bytes_of(state) != loaded) std::abort();
  }
  try {
    (void)kiln::read_checkpoint_info(file);
  } catch (const kiln::Error&) {
    // a refusal is the expected answer to most inputs
  }
  return 0;
}
