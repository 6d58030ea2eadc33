// kiln::dist::ThreadGroup: ranks that are threads of one process, as Communicators. The same
// data-parallel step runs on it as on MPI; it needs no MPI, so the compiler's collective ops
// are tested everywhere, and a trainer can split one machine's cores among ranks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/communicator.hpp"
#include "kiln/core/error.hpp"

namespace kiln::dist {

/// `ranks` Communicators, one per thread that will act as a rank; each rank's thread uses
/// only its own. An all-reduce is summed in rank order by the last rank to start it, so every
/// rank gets the same bits. A collective still unfinished after `timeout_seconds` fails.
inline std::vector<std::shared_ptr<Communicator>> thread_group(int ranks,
                                                               double timeout_seconds = 120.0);

namespace detail {

/// What the ranks of one group share.
class ThreadGroupState {
public:
  ThreadGroupState(int ranks, double timeout_seconds)
      : ranks_(ranks), timeout_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(timeout_seconds))) {}

  [[nodiscard]] int ranks() const { return ranks_; }

  void reserve(int slots) {
    std::lock_guard lock(mutex_);
    while (static_cast<int>(slots_.size()) < slots)
      slots_.push_back(
          Slot{std::vector<float*>(static_cast<std::size_t>(ranks_), nullptr), 0, 0, 0, {}});
  }

  void start_sum(int rank, int slot, float* data, std::int64_t count) noexcept {
    std::lock_guard lock(mutex_);
    Slot& s = slots_[static_cast<std::size_t>(slot)];
    s.buffers[static_cast<std::size_t>(rank)] = data;
    s.count = count;
    if (++s.arrived < ranks_) return;
    // The last rank to arrive sums in rank order and hands every rank the same result.
    float* first = s.buffers[0];
    for (int r = 1; r < ranks_; ++r) {
      const float* other = s.buffers[static_cast<std::size_t>(r)];
      for (std::int64_t i = 0; i < count; ++i) first[i] += other[i];
    }
    for (int r = 1; r < ranks_; ++r)
      std::memcpy(s.buffers[static_cast<std::size_t>(r)], first,
                  static_cast<std::size_t>(count) * sizeof(float));
    s.arrived = 0;
    ++s.completed;
    s.completed_at = std::chrono::steady_clock::now();
    changed_.notify_all();
  }

  /// Waits for the `generation`-th completion of `slot` (counted from 1); `finished` is when
  /// it completed, or when this rank stopped waiting for it.
  bool wait(int rank, int slot, std::uint64_t generation,
            std::chrono::steady_clock::time_point& finished) noexcept {
    std::unique_lock lock(mutex_);
    const Slot& s = slots_[static_cast<std::size_t>(slot)];
    const bool done_before = s.completed >= generation;
    const bool done =
        changed_.wait_for(lock, timeout_, [&] { return failed_ || s.completed >= generation; });
    if (!done && !failed_) {
      failed_ = true;
      std::snprintf(failure_, sizeof failure_,
                    "rank %d: the all-reduce of gradient bucket %d (%lld floats) did not finish "
                    "in time: another rank has died or hangs (thread_group timeout %.0f s)",
                    rank, slot, static_cast<long long>(s.count),
                    std::chrono::duration<double>(timeout_).count());
      changed_.notify_all();
    }
    finished = done_before ? s.completed_at : std::chrono::steady_clock::now();
    return !failed_;
  }

  [[nodiscard]] std::string failure() const {
    std::lock_guard lock(mutex_);
    return failed_ ? std::string(failure_) : std::string();
  }

  /// A blocking collective: every rank deposits its data; the last one runs `combine` over
  /// all of them (by rank); all return when it has.
  template <class Combine>
  void together(int rank, void* data, const std::string& what, Combine combine) {
    std::unique_lock lock(mutex_);
    if (failed_) fail(errc::dist_collective, "rank " + std::to_string(rank) + ": " + failure_);
    if (deposited_.empty()) deposited_.assign(static_cast<std::size_t>(ranks_), nullptr);
    deposited_[static_cast<std::size_t>(rank)] = data;
    const std::uint64_t round = rounds_;
    if (++arrived_ == ranks_) {
      combine(deposited_);
      arrived_ = 0;
      ++rounds_;
      changed_.notify_all();
      return;
    }
    if (!changed_.wait_for(lock, timeout_, [&] { return failed_ || rounds_ > round; })) {
      failed_ = true;
      std::snprintf(failure_, sizeof failure_, "rank %d: %s did not finish in time", rank,
                    what.c_str());
      changed_.notify_all();
    }
    if (failed_)
      fail(errc::dist_collective,
           "rank " + std::to_string(rank) + ": " + what + " failed: " + failure_);
  }

private:
  struct Slot {
    std::vector<float*> buffers;
    std::int64_t count;
    int arrived;
    std::uint64_t completed;
    std::chrono::steady_clock::time_point completed_at;
  };
  int ranks_;
  std::chrono::steady_clock::duration timeout_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Slot> slots_;
  std::vector<void*> deposited_;
  int arrived_ = 0;
  std::uint64_t rounds_ = 0;
  bool failed_ = false;
  char failure_[512] = {};
};

/// One rank's view of a ThreadGroupState.
class ThreadRank final : public Communicator {
public:
  ThreadRank(std::shared_ptr<ThreadGroupState> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return group_->ranks(); }
  void reserve(int slots) override {
    group_->reserve(slots);
    if (static_cast<int>(started_.size()) < slots) {
      started_.resize(static_cast<std::size_t>(slots));
      started_at_.resize(static_cast<std::size_t>(slots));
    }
  }
  void start_sum(int slot, float* data, std::int64_t count) noexcept override {
    ++started_[static_cast<std::size_t>(slot)];
    started_at_[static_cast<std::size_t>(slot)] = Clock::now();
    group_->start_sum(rank_, slot, data, count);
  }
  bool wait(int slot) noexcept override {
    const Clock::time_point asked = Clock::now();
    Clock::time_point finished;
    const bool ok = group_->wait(rank_, slot, started_[static_cast<std::size_t>(slot)], finished);
    if (ok) record_times(started_at_[static_cast<std::size_t>(slot)], asked, finished);
    return ok;
  }
  [[nodiscard]] std::string failure() const override { return group_->failure(); }

  void sum(std::span<double> values) override {
    group_->together(rank_, values.data(), "sum", [&](const std::vector<void*>& all) {
      std::vector<double> total(values.size(), 0.0);
      for (void* p : all)
        for (std::size_t i = 0; i < values.size(); ++i) total[i] += static_cast<double*>(p)[i];
      for (void* p : all) std::memcpy(p, total.data(), values.size_bytes());
    });
  }
  void broadcast(std::span<float> values, int root) override {
    group_->together(rank_, values.data(), "broadcast", [&](const std::vector<void*>& all) {
      for (std::size_t r = 0; r < all.size(); ++r)
        if (static_cast<int>(r) != root)
          std::memcpy(all[r], all[static_cast<std::size_t>(root)], values.size_bytes());
    });
  }
  [[nodiscard]] std::vector<std::uint64_t> gather(std::uint64_t value) override {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(size()));
    all[static_cast<std::size_t>(rank_)] = value;
    group_->together(rank_, all.data(), "gather", [&](const std::vector<void*>& each) {
      std::vector<std::uint64_t> merged(each.size());
      for (std::size_t r = 0; r < each.size(); ++r)
        merged[r] = static_cast<std::uint64_t*>(each[r])[r];
      for (void* p : each) std::memcpy(p, merged.data(), merged.size() * sizeof(std::uint64_t));
    });
    return all;
  }

private:
  std::shared_ptr<ThreadGroupState> group_;
  int rank_;
  std::vector<std::uint64_t> started_;        ///< how often this rank started each slot
  std::vector<Clock::time_point> started_at_; ///< when it last did
};

} // namespace detail

inline std::vector<std::shared_ptr<Communicator>> thread_group(int ranks, double timeout_seconds) {
  if (ranks < 1 || !(timeout_seconds > 0.0))
    fail(errc::argument, "thread_group: needs ranks >= 1 and a timeout > 0, got " +
                             std::to_string(ranks) + " ranks");
  auto state = std::make_shared<detail::ThreadGroupState>(ranks, timeout_seconds);
  std::vector<std::shared_ptr<Communicator>> all;
  for (int r = 0; r < ranks; ++r) all.push_back(std::make_shared<detail::ThreadRank>(state, r));
  return all;
}

} // namespace kiln::dist
