// Decisions forced on the passes: the choices a tuner measured, which replace a pass's rule
// where one is given. Each choice is keyed by where the pass decides it, in the graph that
// pass sees; a pass asks for its own keys and ignores the rest.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "kiln/ir/graph.hpp"

namespace kiln {

/// Choices that replace the passes' rules, by decision key (see the key functions below).
struct Decisions {
  std::map<std::string, std::string, std::less<>> choices;

  /// The choice forced for `key`, or nullptr where the pass's rule decides.
  [[nodiscard]] const std::string* find(std::string_view key) const {
    const auto it = choices.find(key);
    return it == choices.end() ? nullptr : &it->second;
  }
  [[nodiscard]] bool empty() const { return choices.empty(); }
};

/// The layout pass's decision for the group of activations whose first value (in the graph
/// the pass saw) is `first`: "NHWC" or "NCHW".
inline std::string layout_decision_key(ValueId first) { return "layout %" + std::to_string(first); }

/// The epilogue pass's decision to fold consumer into anchor (numbered as in the graph the
/// pass saw): "fuse" or "apart".
inline std::string epilogue_decision_key(ValueId anchor, ValueId consumer) {
  return "epilogue %" + std::to_string(anchor) + " -> %" + std::to_string(consumer);
}

/// The winograd pass's decision for convolution `node` (numbered as in the graph the pass
/// saw): "winograd" or "direct".
inline std::string algorithm_decision_key(ValueId node) {
  return "algorithm %" + std::to_string(node);
}

} // namespace kiln
