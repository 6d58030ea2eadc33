// checkpoint_stress: saves checkpoints over and over to be killed mid-save, then checks the file.
//   checkpoint_stress write DIR   saves steps 1, 2, ... to DIR/checkpoint.safetensors forever,
//                                 printing "saved" once the first save is in place
//   checkpoint_stress check DIR   loads it; exit 0 ("ok step N") if every element is the one
//                                 step N wrote, else 1 naming what is wrong
// Used by tests/programs/check_kill_during_save.sh.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"

namespace {

/// Sizes of the tensors saved: about 5 MB in all, so a save lasts long enough for a kill to
/// land inside it, plus one tiny tensor.
constexpr std::int64_t sizes[] = {1'000'000, 300'000, 7};

/// The value step `step` stores at element `element` of tensor `tensor`: an integer below 2^24,
/// so exactly a float, and different for neighbouring steps, tensors and elements.
float value(std::int64_t step, std::size_t tensor, std::size_t element) {
  const std::uint64_t mixed = static_cast<std::uint64_t>(step) * 65'537u + tensor * 8'191u +
                              static_cast<std::uint64_t>(element) * 31u;
  return static_cast<float>(mixed % 16'777'213u);
}

std::vector<kiln::nn::Parameter> make_tensors() {
  std::vector<kiln::nn::Parameter> tensors;
  for (std::size_t t = 0; t < std::size(sizes); ++t)
    tensors.push_back({"tensor" + std::to_string(t),
                       std::make_shared<kiln::Tensor>(kiln::Shape{sizes[t]}, kiln::f32)});
  return tensors;
}

[[noreturn]] void write(const std::filesystem::path& file) {
  const std::vector<kiln::nn::Parameter> tensors = make_tensors();
  for (std::int64_t step = 1;; ++step) {
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const std::span<float> data = tensors[t].tensor->f32();
      for (std::size_t e = 0; e < data.size(); ++e) data[e] = value(step, t, e);
    }
    kiln::CheckpointInfo info;
    info.step = step;
    kiln::save_checkpoint(file, tensors, info);
    if (step == 1) {
      std::puts("saved");
      std::fflush(stdout);
    }
  }
}

int check(const std::filesystem::path& file) {
  const std::vector<kiln::nn::Parameter> tensors = make_tensors();
  const kiln::CheckpointInfo info = kiln::load_checkpoint(file, tensors);
  if (info.step < 1) {
    std::printf("FAIL: step %lld in the file, the writer starts at 1\n",
                static_cast<long long>(info.step));
    return 1;
  }
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const std::span<const float> data = tensors[t].tensor->f32();
    for (std::size_t e = 0; e < data.size(); ++e)
      if (data[e] != value(info.step, t, e)) {
        std::printf("FAIL: step %lld: %s[%zu] is %.9g, step %lld wrote %.9g\n",
                    static_cast<long long>(info.step), tensors[t].name.c_str(), e,
                    static_cast<double>(data[e]), static_cast<long long>(info.step),
                    static_cast<double>(value(info.step, t, e)));
        return 1;
      }
  }
  std::printf("ok step %lld\n", static_cast<long long>(info.step));
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "write" && mode != "check") {
    std::fprintf(stderr, "usage: checkpoint_stress write|check DIR\n");
    return 2;
  }
  const std::filesystem::path file = std::filesystem::path(argv[2]) / "checkpoint.safetensors";
  try {
    if (mode == "write") write(file);
    return check(file);
  } catch (const kiln::Error& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::printf("FAIL: not a kiln::Error: %s\n", e.what());
    return 1;
  }
}
