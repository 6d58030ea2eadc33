// Checkpoints: a round trip restores every tensor bit for bit and the training position, the
// file is plain safetensors, and a truncated, bit-flipped or foreign file is refused, naming
// what was wrong, without touching the tensors.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/kiln.hpp"
#include "support/temp_folder.hpp"

namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<char>;

/// A folder of this test's own, removed afterwards.
struct Folder : kiln::test::TempFolder {
  Folder() : TempFolder("kiln-checkpoint") {}
};

Bytes read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_all(const fs::path& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
}

/// A small CNN trained a few steps with momentum, so every kind of state tensor is non-zero.
struct Trained {
  kiln::nn::Sequential net;
  kiln::Graph g;
  kiln::TrainStep step;
  Trained() : net(make()), step(build(g, net)) {
    kiln::Executor exe = kiln::compile(g, {.threads = 1});
    kiln::Rng rng(3);
    std::vector<float> x(4 * 8 * 8);
    for (float& v : x) v = rng.uniform(-1.0f, 1.0f);
    exe.set_input("x", x);
    exe.set_input("y", std::vector<std::int32_t>{1, 2, 3, 4});
    for (int i = 0; i < 3; ++i) exe.run();
  }
  static kiln::nn::Sequential make() {
    kiln::nn::manual_seed(7);
    return kiln::nn::Sequential{kiln::nn::Conv2d(1, 4, 3), kiln::nn::ReLU(), kiln::nn::Flatten(),
                                kiln::nn::Linear(4 * 6 * 6, 10)};
  }
  static kiln::TrainStep build(kiln::Graph& g, kiln::nn::Sequential& net) {
    const auto x = g.input("x", {4, 1, 8, 8});
    const auto y = g.input("y", {4}, kiln::i32);
    return kiln::train_step(kiln::softmax_cross_entropy(net(x), y), net.parameters(),
                            kiln::optim::SGD{.lr = 0.05f, .momentum = 0.9f});
  }
  [[nodiscard]] std::vector<kiln::nn::Parameter> state() const {
    return kiln::training_state(net, step);
  }
  [[nodiscard]] std::vector<std::vector<float>> values() const {
    std::vector<std::vector<float>> v;
    for (const auto& p : state()) v.emplace_back(p.tensor->f32().begin(), p.tensor->f32().end());
    return v;
  }
};

/// The length of a safetensors file's JSON header: its first 8 bytes, little-endian.
std::uint64_t header_length(const Bytes& file) {
  std::uint64_t length = 0;
  for (int i = 7; i >= 0; --i)
    length = length << 8 | static_cast<std::uint8_t>(file[static_cast<std::size_t>(i)]);
  return length;
}

/// The trained network's state saved with default settings, and the file's bytes.
struct Saved {
  Folder folder;
  const Trained trained;
  const fs::path path = folder.path / "saved.safetensors";
  const Bytes bytes = save_and_read(path, trained);
  static Bytes save_and_read(const fs::path& path, const Trained& trained) {
    kiln::save_checkpoint(path, trained.state(), {});
    return read_all(path);
  }
};

kiln::Error load_error(const fs::path& p, const Trained& t) {
  try {
    (void)kiln::load_checkpoint(p, t.state());
  } catch (const kiln::Error& e) {
    return e;
  }
  FAIL("the checkpoint was accepted");
  return kiln::Error("", "");
}

} // namespace

TEST_CASE("checkpoint: a round trip restores every tensor bit for bit and the position") {
  Folder folder;
  const Trained trained;
  const fs::path path = folder.path / "step.safetensors";
  kiln::save_checkpoint(path, trained.state(),
                        {.step = 3, .epoch = 1, .batch = 2, .seed = 42, .metadata = {{"a", "b"}}});
  Trained other; // the same network and steps, changed below
  for (const auto& p : other.state())
    for (float& v : p.tensor->f32()) v = 0.5f;
  const kiln::CheckpointInfo info = kiln::load_checkpoint(path, other.state());
  CHECK(other.values() == trained.values());
  CHECK(info.step == 3);
  CHECK(info.epoch == 1);
  CHECK(info.batch == 2);
  CHECK(info.seed == 42);
  CHECK(info.metadata.at("a") == "b");
  const auto state = trained.state(); // optimizer state is in the file too
  CHECK(std::ranges::any_of(state, [](const auto& p) { return p.name == "lr"; }));
  CHECK(std::ranges::any_of(state, [](const auto& p) { return p.name.ends_with(".momentum"); }));
}

TEST_CASE("checkpoint: the file is safetensors: a length, a JSON header, the raw data") {
  const Saved saved;
  const Bytes& file = saved.bytes;
  REQUIRE(file.size() > 8);
  const std::uint64_t header_bytes = header_length(file);
  CHECK(header_bytes % 8 == 0);
  const auto header =
      nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + static_cast<long>(header_bytes));
  const std::size_t data = 8 + header_bytes;
  for (const auto& p : saved.trained.state()) {
    INFO(p.name);
    const auto& entry = header.at(p.name);
    CHECK(entry.at("dtype") == "F32");
    const auto begin = entry.at("data_offsets")[0].get<std::size_t>();
    std::vector<float> stored(static_cast<std::size_t>(p.tensor->numel()));
    std::memcpy(stored.data(), file.data() + data + begin, stored.size() * sizeof(float));
    CHECK(std::equal(stored.begin(), stored.end(), p.tensor->f32().begin()));
  }
  CHECK(header.at("__metadata__").at("format") == "kiln");
  // Saving again replaces the file whole and leaves no temporary behind.
  kiln::save_checkpoint(saved.path, saved.trained.state(), {.step = 9});
  CHECK(std::distance(fs::directory_iterator(saved.folder.path), fs::directory_iterator()) == 1);
}

TEST_CASE("checkpoint: every truncation, every flipped header byte and data bits are refused") {
  const Saved saved;
  const Trained& trained = saved.trained;
  const Bytes& good = saved.bytes;
  const std::vector<std::vector<float>> before = trained.values();
  const fs::path bad = saved.folder.path / "bad.safetensors";
  for (std::size_t keep = 0; keep < good.size(); keep += 1 + keep / 16) {
    write_all(bad, Bytes(good.begin(), good.begin() + static_cast<long>(keep)));
    const kiln::Error e = load_error(bad, trained);
    INFO("kept " << keep << " of " << good.size() << " bytes: " << e.what());
    CHECK(e.code().starts_with("kiln.checkpoint."));
  }
  const std::size_t data_start = 8 + header_length(good);
  for (std::size_t at = 0; at < good.size(); at += at < data_start ? 1 : 97) {
    Bytes flipped = good;
    flipped[at] = static_cast<char>(flipped[at] ^ 0x10);
    write_all(bad, flipped);
    bool refused = false;
    try {
      (void)kiln::load_checkpoint(bad, trained.state());
    } catch (const kiln::Error& e) {
      refused = e.code().starts_with("kiln.checkpoint.");
    }
    INFO("byte " << at << " flipped (the data starts at " << data_start << ")");
    CHECK(refused);
  }
  CHECK(trained.values() == before);
}

TEST_CASE("checkpoint: another network's checkpoint is refused naming the tensor") {
  Folder folder;
  const Trained trained;
  const fs::path path = folder.path / "other.safetensors";
  kiln::nn::manual_seed(1);
  kiln::nn::Linear wider(3, 5);
  kiln::save_checkpoint(path, wider.parameters(), {});
  kiln::Error e = load_error(path, trained);
  CHECK(e.code() == "kiln.checkpoint.mismatch");
  kiln::nn::Linear narrower(3, 4);
  std::vector<kiln::nn::Parameter> renamed = narrower.parameters();
  renamed[0].name = wider.parameters()[0].name;
  renamed[1].name = wider.parameters()[1].name;
  try {
    (void)kiln::load_checkpoint(path, renamed);
    FAIL("a [5,3] weight loaded into a [4,3] one");
  } catch (const kiln::Error& err) {
    CHECK(err.code() == "kiln.checkpoint.mismatch");
    CHECK(err.message().find("has shape [5,3], the network's is [4,3]") != std::string::npos);
  }
  e = load_error(folder.path / "missing.safetensors", trained);
  CHECK(e.code() == "kiln.checkpoint.io");
}

TEST_CASE("checkpoint: a data size past 2^63 in the metadata is a format error, not an exception") {
  const Saved saved;
  const std::uint64_t length = header_length(saved.bytes);
  const auto data = saved.bytes.begin() + 8 + static_cast<long>(length);
  const auto header = nlohmann::json::parse(saved.bytes.begin() + 8, data);
  // The data size is read before the checksum is checked, so a hostile one reaches the parser.
  for (const char* number : {"99999999999999999999", "9223372036854775808", "-1", "1e3"}) {
    auto changed = header;
    changed["__metadata__"]["kiln.data_bytes"] = number;
    std::string text = changed.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string file(8, '\0');
    for (std::size_t i = 0; i < 8; ++i) file[i] = static_cast<char>(text.size() >> (8 * i));
    file += text;
    file.append(data, saved.bytes.end());
    const fs::path bad = saved.folder.path / "number.safetensors";
    write_all(bad, Bytes(file.begin(), file.end()));
    INFO("kiln.data_bytes = " << number);
    CHECK(load_error(bad, saved.trained).code() == "kiln.checkpoint.format");
  }
}

TEST_CASE("checkpoint: a model's weights are read from a training checkpoint only when asked") {
  const Saved saved;
  Trained fresh;
  for (const auto& p : fresh.state())
    for (float& v : p.tensor->f32()) v = 0.5f;
  const std::vector<kiln::nn::Parameter> weights = kiln::model_state(fresh.net);
  const kiln::Error strict = [&] {
    try {
      (void)kiln::load_checkpoint(saved.path, weights);
    } catch (const kiln::Error& e) {
      return e;
    }
    FAIL("the optimizer's tensors in the file were ignored without asking");
    return kiln::Error("", "");
  }();
  CHECK(strict.code() == "kiln.checkpoint.mismatch");
  CHECK(strict.message().find("skip_unlisted") != std::string::npos);
  CHECK(fresh.net.parameters()[0].tensor->f32()[0] == 0.5f); // refused before any write

  (void)kiln::load_checkpoint(saved.path, weights, {.skip_unlisted = true});
  const auto trained_weights = kiln::model_state(saved.trained.net);
  REQUIRE(weights.size() == trained_weights.size());
  for (std::size_t i = 0; i < weights.size(); ++i) {
    INFO(weights[i].name);
    CHECK(std::ranges::equal(weights[i].tensor->f32(), trained_weights[i].tensor->f32()));
  }
  for (const auto& p : fresh.state()) // the optimizer's state is left as it was
    if (p.name.ends_with(".momentum")) CHECK(p.tensor->f32()[0] == 0.5f);

  // Skipping what is not asked for never forgives what is asked for and missing.
  kiln::nn::manual_seed(1);
  kiln::nn::Linear other(3, 5);
  std::vector<kiln::nn::Parameter> asked = weights;
  asked.push_back(other.parameters()[0]);
  asked.back().name = "not.in.the.file";
  try {
    (void)kiln::load_checkpoint(saved.path, asked, {.skip_unlisted = true});
    FAIL("a tensor missing from the file was accepted");
  } catch (const kiln::Error& e) {
    CHECK(e.code() == "kiln.checkpoint.mismatch");
    CHECK(e.message().find("has no tensor 'not.in.the.file'") != std::string::npos);
  }
}

TEST_CASE("checkpoint: a save removes what killed saves left, and only theirs") {
  const Saved saved;
  // A process id that existed and is gone: a child that has exited and been reaped.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  REQUIRE(::waitpid(child, nullptr, 0) == child);
  const std::string prefix = ".saved.safetensors.tmp";
  const fs::path dead = saved.folder.path / (prefix + std::to_string(child) + ".0");
  const fs::path live = saved.folder.path / (prefix + std::to_string(::getpid()) + ".77");
  const fs::path other_file =
      saved.folder.path / (".other.safetensors.tmp" + std::to_string(child) + ".0");
  const fs::path not_ours = saved.folder.path / (prefix + "notapid");
  for (const fs::path& p : {dead, live, other_file, not_ours}) write_all(p, Bytes(16, 'x'));
  kiln::save_checkpoint(saved.path, saved.trained.state(), {.step = 1});
  CHECK_FALSE(fs::exists(dead));
  CHECK(fs::exists(live));       // its writer may still rename it
  CHECK(fs::exists(other_file)); // another checkpoint's save cleans up its own
  CHECK(fs::exists(not_ours));
  CHECK(kiln::load_checkpoint(saved.path, saved.trained.state()).step == 1);
}

TEST_CASE("checkpoint: threads saving and loading at once each get whole files") {
  const Saved saved;
  std::vector<std::unique_ptr<Trained>> copies; // built here: the layers' seed is global
  for (int t = 0; t < 4; ++t) copies.push_back(std::make_unique<Trained>());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      try {
        Trained& copy = *copies[static_cast<std::size_t>(t)];
        for (int i = 0; i < 10; ++i) {
          // Two threads share each path, so saves of one file race one another.
          kiln::save_checkpoint(saved.folder.path / ("shared" + std::to_string(t % 2)),
                                saved.trained.state(), {.step = t});
          const auto info = kiln::load_checkpoint(
              saved.folder.path / ("shared" + std::to_string(t % 2)), copy.state());
          if (info.step % 2 != t % 2 || copy.values() != saved.trained.values()) ++failures;
        }
      } catch (const kiln::Error&) {
        ++failures;
      }
    });
  for (std::thread& t : threads) t.join();
  CHECK(failures == 0);
  for (const auto& entry : fs::directory_iterator(saved.folder.path)) // no temporaries remain
    CHECK_FALSE(entry.path().filename().string().starts_with("."));
}
