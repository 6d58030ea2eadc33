// How far apart two of the machine's cores are, timed as the round trip of one cache line
// between threads pinned to them. A virtual machine's host may move its vCPUs during a run
// between cores that share a cache (about 80 ns on the Zen 5 development host) and cores on
// different chiplets (about 400 ns); a training step that hands activations from one thread to
// the other then slows by up to 40% (LeNet-5: 0.63 against 0.88 ms), with no other process
// busy. The benchmarks measure it every round so a run that straddled both is seen as such.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

namespace bench {

/// The first and the last CPU this process may run on; none with fewer than two. On a
/// machine of several chiplets the two are the farthest apart, on a two-vCPU machine the
/// only pair.
inline std::optional<std::pair<int, int>> outermost_cpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return std::nullopt;
  int first = -1, last = -1;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) {
      if (first < 0) first = c;
      last = c;
    }
  if (first < 0 || first == last) return std::nullopt;
  return std::pair{first, last};
}

namespace detail {
inline bool pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}
} // namespace detail

/// Nanoseconds of one round trip of a cache line between a thread on CPU `a` and one on CPU
/// `b`: the median of `bursts` bursts of 256 round trips (about 0.1-0.5 ms in all). A core busy
/// with another process answers only when it is scheduled: after `limit` the probe stops and
/// gives the time per round trip so far, counting the one unanswered as done, which is a lower
/// bound. None where the threads cannot be pinned.
inline std::optional<double>
round_trip_ns(int a, int b, int bursts = 5,
              std::chrono::milliseconds limit = std::chrono::milliseconds(20)) {
  using clock = std::chrono::steady_clock;
  constexpr int trips = 256;
  alignas(64) std::atomic<int> ball{0};
  std::atomic<bool> pinned_b{false}, failed{false}, done{false};
  std::thread answerer([&] {
    if (!detail::pin_to(b)) {
      failed = true;
      return;
    }
    pinned_b = true;
    // Returns every odd value as the next even one until told to stop.
    while (!done.load(std::memory_order_relaxed)) {
      const int v = ball.load(std::memory_order_acquire);
      if (v & 1) ball.store(v + 1, std::memory_order_release);
    }
  });
  std::vector<double> ns;
  cpu_set_t original;
  const bool have_original = sched_getaffinity(0, sizeof original, &original) == 0;
  if (have_original && detail::pin_to(a)) {
    const auto deadline = clock::now() + limit;
    while (!pinned_b && !failed && clock::now() < deadline) std::this_thread::yield();
    bool late = !pinned_b;
    for (int burst = 0; burst < bursts && !failed && !late; ++burst) {
      const auto t0 = clock::now();
      int answered = 0;
      while (answered < trips && !late) {
        const int v = ball.load(std::memory_order_relaxed) + 1;
        ball.store(v, std::memory_order_release);
        for (unsigned spins = 1; ball.load(std::memory_order_acquire) == v; ++spins)
          if (spins % 4096 == 0 && clock::now() > deadline) {
            late = true;
            break;
          }
        if (!late) ++answered;
      }
      ns.push_back(std::chrono::duration<double, std::nano>(clock::now() - t0).count() /
                   (late ? answered + 1 : trips));
    }
  }
  done = true;
  answerer.join();
  if (have_original) sched_setaffinity(0, sizeof original, &original);
  if (ns.empty()) return std::nullopt;
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}

} // namespace bench
