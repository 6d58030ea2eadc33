// kiln::dist::Mpi: the Communicator over MPI. All-reduces run non-blocking (MPI_Iallreduce),
// issued and driven to completion by a progress thread of their own, so they overlap the
// step's compute; a watchdog turns a collective that does not finish in time (a rank died or
// hangs) into an error on every rank still running. Needs <mpi.h>: link MPI::MPI_CXX.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/communicator.hpp"
#include "kiln/core/error.hpp"

namespace kiln::dist {

/// Settings of the MPI communicator.
struct MpiOptions {
  /// A collective still unfinished after this long fails on every rank that waits for it,
  /// naming the collective: a rank has died or hangs.
  double timeout_seconds = 120.0;
  /// How often the progress thread tests the collectives in flight.
  std::chrono::microseconds poll_interval{20};
};

/// Every process that mpirun started, as one Communicator. Create it once, first thing in
/// main (it calls MPI_Init_thread, asking for MPI_THREAD_MULTIPLE), with Mpi::start; MPI is
/// finalized when the last reference goes (the compiled steps hold one).
class Mpi final : public Communicator {
public:
  /// Initialises MPI from main's arguments. kiln.dist.unavailable when MPI cannot give the
  /// thread support the progress thread needs.
  static std::shared_ptr<Mpi> start(int& argc, char**& argv, MpiOptions options = {}) {
    return std::shared_ptr<Mpi>(new Mpi(&argc, &argv, options));
  }
  /// The same, for a program that has parsed its arguments itself (Open MPI needs none).
  static std::shared_ptr<Mpi> start(MpiOptions options = {}) {
    return std::shared_ptr<Mpi>(new Mpi(nullptr, nullptr, options));
  }

  Mpi(const Mpi&) = delete;
  Mpi& operator=(const Mpi&) = delete;

  ~Mpi() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    posted_.notify_all();
    if (progress_.joinable()) progress_.join();
    // A collective that never finished cannot be finalized past: the job ends here instead of
    // hanging in MPI_Finalize (the error has been reported by then).
    if (failed_ || in_flight_ > 0) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Comm_free(&blocking_);
    MPI_Comm_free(&steps_);
    if (owns_mpi_) MPI_Finalize();
  }

  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return size_; }

  void reserve(int slots) override {
    std::lock_guard lock(mutex_);
    if (in_flight_ > 0)
      fail(errc::argument, "Mpi::reserve: collectives are in flight (a step is running)");
    if (slots > static_cast<int>(slots_.size())) slots_.resize(static_cast<std::size_t>(slots));
  }

  void start_sum(int slot, float* data, std::int64_t count) noexcept override {
    {
      std::lock_guard lock(mutex_);
      Slot& s = slots_[static_cast<std::size_t>(slot)];
      s.data = data;
      s.count = count;
      s.state = State::posted;
      s.posted = Clock::now();
    }
    posted_.notify_one();
  }

  bool wait(int slot) noexcept override {
    const Clock::time_point asked = Clock::now();
    std::unique_lock lock(mutex_);
    Slot& s = slots_[static_cast<std::size_t>(slot)];
    const bool done_before = s.state == State::done;
    // The progress thread's watchdog fires first; this one covers a progress thread stuck
    // inside MPI itself.
    const auto deadline = Clock::now() + timeout_ + std::chrono::seconds(5);
    while (s.state != State::done && !failed_)
      if (done_.wait_until(lock, deadline) == std::cv_status::timeout && s.state != State::done &&
          !failed_)
        record_failure(slot, s, "was not reported done by the progress thread");
    if (failed_) return false;
    record_times(s.posted, asked, done_before ? s.finished : Clock::now());
    s.state = State::idle;
    // A step is over when all its collectives are: the next one issues from slot 0 again,
    // whichever plan (with however many slots) runs it.
    if (std::all_of(slots_.begin(), slots_.end(),
                    [](const Slot& t) { return t.state == State::idle; }))
      next_ = 0;
    return true;
  }

  [[nodiscard]] std::string failure() const override {
    std::lock_guard lock(mutex_);
    return failed_ ? std::string(failure_) : std::string();
  }

  void sum(std::span<double> values) override {
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, values.data(), count_of(values.size(), "sum"), MPI_DOUBLE,
                         MPI_SUM, blocking_, &request),
          "sum");
    finish(request, "sum of " + std::to_string(values.size()) + " numbers");
  }

  void broadcast(std::span<float> values, int root) override {
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibcast(values.data(), count_of(values.size(), "broadcast"), MPI_FLOAT, root,
                     blocking_, &request),
          "broadcast");
    finish(request, "broadcast of " + std::to_string(values.size()) + " floats from rank " +
                        std::to_string(root));
  }

  [[nodiscard]] std::vector<std::uint64_t> gather(std::uint64_t value) override {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(size_));
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, blocking_, &request),
          "gather");
    finish(request, "gather");
    return all;
  }

private:
  enum class State : std::uint8_t { idle, posted, active, done };
  struct Slot {
    float* data = nullptr;
    std::int64_t count = 0;
    State state = State::idle;
    MPI_Request request = MPI_REQUEST_NULL;
    Clock::time_point posted{}, started{}, finished{};
  };

  Mpi(int* argc, char*** argv, MpiOptions options)
      : timeout_(std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(options.timeout_seconds))),
        poll_(options.poll_interval) {
    if (!(options.timeout_seconds > 0.0)) fail(errc::argument, "Mpi: timeout_seconds must be > 0");
    int initialised = 0;
    MPI_Initialized(&initialised);
    int provided = MPI_THREAD_SINGLE;
    if (initialised) {
      MPI_Query_thread(&provided);
    } else {
      if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        fail(errc::dist_unavailable, "MPI_Init_thread failed");
      owns_mpi_ = true;
    }
    if (provided < MPI_THREAD_MULTIPLE) {
      if (owns_mpi_) MPI_Finalize();
      fail(errc::dist_unavailable,
           "the MPI library gives thread support level " + std::to_string(provided) +
               ", below MPI_THREAD_MULTIPLE, which kiln's progress thread needs");
    }
    // Steps and the blocking calls between them each get a communicator of their own, whose
    // errors are returned to kiln rather than aborting the job.
    MPI_Comm_dup(MPI_COMM_WORLD, &steps_);
    MPI_Comm_dup(MPI_COMM_WORLD, &blocking_);
    MPI_Comm_set_errhandler(steps_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(blocking_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(steps_, &rank_);
    MPI_Comm_size(steps_, &size_);
    progress_ = std::thread([this] { progress(); });
  }

  [[nodiscard]] std::string mpi_error(int code) const {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    return std::string(text, static_cast<std::size_t>(length));
  }

  void check(int code, const char* what) const {
    if (code != MPI_SUCCESS)
      fail(errc::dist_collective,
           "rank " + std::to_string(rank_) + ": " + what + ": " + mpi_error(code));
  }

  [[nodiscard]] int count_of(std::size_t n, const char* what) const {
    if (n > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      fail(errc::argument, std::string("Mpi::") + what + ": " + std::to_string(n) +
                               " elements, more than one MPI call takes");
    return static_cast<int>(n);
  }

  /// Drives one blocking call's request to completion under the watchdog. The pause between
  /// tests grows to a millisecond, so a rank waiting long for the others (while rank 0 writes a
  /// checkpoint) leaves its core to them.
  void finish(MPI_Request& request, const std::string& what) {
    const auto deadline = Clock::now() + timeout_;
    std::chrono::microseconds pause = poll_;
    for (;;) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what.c_str());
      if (done) return;
      if (Clock::now() > deadline)
        fail(errc::dist_collective,
             "rank " + std::to_string(rank_) + ": " + what + " did not finish within " +
                 std::to_string(std::chrono::duration<double>(timeout_).count()) +
                 " s: another rank has died or hangs");
      std::this_thread::sleep_for(pause);
      pause = std::min(2 * pause, std::max(poll_, std::chrono::microseconds{1000}));
    }
  }

  /// Notes the first failure, naming this rank and the collective; holds the lock. Formats
  /// into a fixed buffer: it runs inside kernels, which never allocate.
  void record_failure(int slot, const Slot& s, const char* why) {
    if (failed_) return;
    failed_ = true;
    std::snprintf(failure_, sizeof failure_,
                  "rank %d: the all-reduce of gradient bucket %d (%lld floats) %s: another rank "
                  "has died or hangs (kiln::dist::MpiOptions::timeout_seconds %.0f s)",
                  rank_, slot, static_cast<long long>(s.count), why,
                  std::chrono::duration<double>(timeout_).count());
    done_.notify_all();
  }

  /// The progress thread: issues posted collectives in slot order (every rank issues them in
  /// the same order, whatever order its schedule posted them in) and tests those in flight.
  void progress() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      while (!failed_ && next_ < slots_.size() && slots_[next_].state == State::posted) {
        Slot& s = slots_[next_];
        const int code = MPI_Iallreduce(MPI_IN_PLACE, s.data, static_cast<int>(s.count), MPI_FLOAT,
                                        MPI_SUM, steps_, &s.request);
        if (code != MPI_SUCCESS) {
          record_failure(static_cast<int>(next_), s, "could not start");
          break;
        }
        s.state = State::active;
        s.started = Clock::now();
        ++in_flight_;
        ++next_;
      }
      if (in_flight_ == 0 || failed_) {
        posted_.wait(lock);
        continue;
      }
      bool finished = false;
      for (std::size_t k = 0; k < slots_.size() && !failed_; ++k) {
        Slot& s = slots_[k];
        if (s.state != State::active) continue;
        int done = 0;
        if (MPI_Test(&s.request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
          record_failure(static_cast<int>(k), s, "failed in MPI");
        } else if (done) {
          s.state = State::done;
          s.finished = Clock::now();
          --in_flight_;
          finished = true;
        } else if (Clock::now() - s.started > timeout_) {
          record_failure(static_cast<int>(k), s, "did not finish in time");
        }
      }
      if (finished) done_.notify_all();
      lock.unlock();
      std::this_thread::sleep_for(poll_);
      lock.lock();
    }
  }

  Clock::duration timeout_;
  std::chrono::microseconds poll_;
  bool owns_mpi_ = false;
  int rank_ = 0, size_ = 1;
  MPI_Comm steps_ = MPI_COMM_NULL, blocking_ = MPI_COMM_NULL;
  mutable std::mutex mutex_;
  std::condition_variable posted_, done_;
  std::vector<Slot> slots_;
  std::size_t next_ = 0; ///< the slot the progress thread issues next
  int in_flight_ = 0;
  bool stopping_ = false, failed_ = false;
  char failure_[512] = {};
  std::thread progress_;
};

} // namespace kiln::dist
