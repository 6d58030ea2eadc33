// libFuzzer harness: any bytes given to the IDX reader (plain or gzip) end in an IDX array
// whose size matches its header, or in a kiln::Error; never a crash, a hang or another
// exception. scripts/fuzz.sh builds and runs it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "fuzz_file.hpp"
#include "kiln/data/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    // A small cap keeps a hostile header from asking for more memory than the fuzzer allows.
    const kiln::data::IdxArray a = kiln::data::read_idx(kiln::fuzz::as_file(data, size), 1 << 20);
    if (a.dims.rank() < 1 || static_cast<std::size_t>(a.dims.numel()) != a.data.size())
      std::abort();
  } catch (const kiln::Error&) {
  }
  return 0;
}
