// The memory planner: places buffers with known lifetimes into one arena so that buffers
// alive at the same time never overlap, and buffers that are not share memory.
#pragma once

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace kiln {

/// A buffer to place: its size and the inclusive range of plan steps during which it lives.
struct BufferRequest {
  std::size_t bytes = 0;
  int first_step = 0;
  int last_step = 0;
};

/// Offsets into one arena for each request, the arena size, and what separate buffers
/// would have needed.
struct MemoryPlan {
  std::vector<std::size_t> offsets;
  std::size_t arena_bytes = 0;
  std::size_t naive_bytes = 0;
};

inline constexpr std::size_t buffer_alignment = 64;

inline std::size_t align_up(std::size_t n, std::size_t a = buffer_alignment) {
  return (n + a - 1) / a * a;
}

inline bool lifetimes_overlap(const BufferRequest& a, const BufferRequest& b) {
  return a.first_step <= b.last_step && b.first_step <= a.last_step;
}

/// Greedy best-fit by decreasing size: each buffer goes to the lowest offset where it does
/// not collide with an already placed buffer whose lifetime overlaps its own.
inline MemoryPlan plan_memory(std::span<const BufferRequest> requests) {
  MemoryPlan plan;
  plan.offsets.assign(requests.size(), 0);
  std::vector<std::size_t> order(requests.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return requests[a].bytes > requests[b].bytes;
  });
  std::vector<std::size_t> placed;
  for (std::size_t i : order) {
    const std::size_t size = align_up(requests[i].bytes);
    plan.naive_bytes += size;
    // Collect the occupied intervals of live neighbours, sorted by offset.
    std::vector<std::pair<std::size_t, std::size_t>> busy;
    for (std::size_t j : placed)
      if (lifetimes_overlap(requests[i], requests[j]))
        busy.emplace_back(plan.offsets[j], plan.offsets[j] + align_up(requests[j].bytes));
    std::sort(busy.begin(), busy.end());
    std::size_t offset = 0;
    for (const auto& [lo, hi] : busy) {
      if (offset + size <= lo) break;
      offset = std::max(offset, hi);
    }
    plan.offsets[i] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + size);
    placed.push_back(i);
  }
  return plan;
}

/// Every buffer at its own offset: what memory planning saves is measured against this.
inline MemoryPlan place_separately(std::span<const BufferRequest> requests) {
  MemoryPlan plan;
  for (const BufferRequest& r : requests) {
    plan.offsets.push_back(plan.arena_bytes);
    plan.arena_bytes += align_up(r.bytes);
  }
  plan.naive_bytes = plan.arena_bytes;
  return plan;
}

/// The first pair of requests that are alive at the same time and overlap in memory, if any.
inline std::optional<std::pair<std::size_t, std::size_t>>
find_overlap(std::span<const BufferRequest> requests, const MemoryPlan& plan) {
  for (std::size_t i = 0; i < requests.size(); ++i)
    for (std::size_t j = i + 1; j < requests.size(); ++j) {
      if (!lifetimes_overlap(requests[i], requests[j]) || requests[i].bytes == 0 ||
          requests[j].bytes == 0)
        continue;
      const std::size_t a0 = plan.offsets[i], a1 = a0 + requests[i].bytes;
      const std::size_t b0 = plan.offsets[j], b1 = b0 + requests[j].bytes;
      if (a0 < b1 && b0 < a1) return std::make_pair(i, j);
    }
  return std::nullopt;
}

} // namespace kiln
