// The contract between kiln's collective ops and a transport (MPI, or one process alone):
// processes that sum float buffers together, started by one kernel and awaited by another.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace kiln {

/// How long the all-reduces of the steps took, and how much of that compute hid.
struct CollectiveTimes {
  std::int64_t collectives = 0;
  /// From start_sum until the sum was complete (for a rank blocked on it: until it resumed),
  /// summed.
  double in_flight_seconds = 0.0;
  /// The part of in_flight_seconds a step spent blocked in wait(): what compute did not hide.
  double waited_seconds = 0.0;
  /// From start_sum until the step asked for the result, summed: the compute each collective
  /// could hide behind, however slow the transport.
  double window_seconds = 0.0;

  /// The share of the all-reduce time that overlapped compute, in [0, 1].
  [[nodiscard]] double hidden_share() const {
    return in_flight_seconds > 0.0 ? 1.0 - waited_seconds / in_flight_seconds : 0.0;
  }
};

/// A fixed group of processes (ranks) training one model, each holding the same parameters.
/// The all-reduce kernels call start_sum and wait from inside a running step, so those two
/// never throw and never allocate: whatever they need (a request slot per collective) is made
/// by reserve() at compile time. The blocking calls are for set-up and evaluation, between
/// steps, and throw kiln::Error (kiln.dist.*) naming the rank and the operation on failure.
class Communicator {
public:
  virtual ~Communicator() = default;

  /// This process's rank, in [0, size()).
  [[nodiscard]] virtual int rank() const = 0;
  /// The number of ranks.
  [[nodiscard]] virtual int size() const = 0;

  /// Makes room for collectives numbered 0 .. slots - 1; called by compile, never by a kernel.
  virtual void reserve(int slots) = 0;
  /// Starts summing data[0 .. count) over every rank, in place, as collective `slot` (every
  /// rank starts the same slots in the same order with the same counts). Returns at once.
  virtual void start_sum(int slot, float* data, std::int64_t count) noexcept = 0;
  /// Waits until collective `slot` is complete. False when it failed or the watchdog gave up on
  /// it; failure() then says why, and every later collective fails at once.
  virtual bool wait(int slot) noexcept = 0;
  /// Why a collective failed, naming this rank, the collective and the cause; empty when none
  /// has. The executor turns it into kiln::Error (kiln.dist.collective) after the step.
  [[nodiscard]] virtual std::string failure() const = 0;

  /// Sums `values` over every rank, in place, and returns when done (evaluation counts).
  virtual void sum(std::span<double> values) = 0;
  /// Copies rank `root`'s `values` into every rank's (the parameters at the start).
  virtual void broadcast(std::span<float> values, int root) = 0;
  /// Every rank's `value`, by rank (the parameter checksums).
  [[nodiscard]] virtual std::vector<std::uint64_t> gather(std::uint64_t value) = 0;

  /// The all-reduce times of the steps since the last call (every collective waited on), and
  /// starts counting afresh: what `mnist_train --profile` reports as overlap.
  CollectiveTimes take_times() {
    std::lock_guard lock(times_mutex_);
    const CollectiveTimes taken = times_;
    times_ = {};
    return taken;
  }

protected:
  using Clock = std::chrono::steady_clock;

  /// Accounts one collective, from wait(): started (start_sum) at `started`, waited on from
  /// `asked`, complete at `finished` (when the step could resume).
  void record_times(Clock::time_point started, Clock::time_point asked,
                    Clock::time_point finished) noexcept {
    const auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
    std::lock_guard lock(times_mutex_);
    ++times_.collectives;
    times_.in_flight_seconds += seconds(finished - started);
    if (finished > asked) times_.waited_seconds += seconds(finished - asked);
    if (asked > started) times_.window_seconds += seconds(asked - started);
  }

private:
  std::mutex times_mutex_;
  CollectiveTimes times_;
};

} // namespace kiln
