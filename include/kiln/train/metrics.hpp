// Metrics for classifiers: top-1 correct counts from a batch of logits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "kiln/core/error.hpp"

namespace kiln {

/// How many of the first `count` rows of `logits` ([rows, classes], row-major) have their
/// largest logit at the row's label.
inline std::int64_t count_correct(std::span<const float> logits,
                                  std::span<const std::int32_t> labels, std::int64_t count,
                                  std::int64_t classes) {
  if (classes <= 0 || count < 0 || static_cast<std::size_t>(count) > labels.size() ||
      static_cast<std::size_t>(count * classes) > logits.size())
    fail(errc::argument, "count_correct: " + std::to_string(count) + " rows of " +
                             std::to_string(classes) + " classes do not fit " +
                             std::to_string(logits.size()) + " logits and " +
                             std::to_string(labels.size()) + " labels");
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    const auto row =
        logits.subspan(static_cast<std::size_t>(i * classes), static_cast<std::size_t>(classes));
    correct += std::max_element(row.begin(), row.end()) - row.begin() ==
               labels[static_cast<std::size_t>(i)];
  }
  return correct;
}

} // namespace kiln
