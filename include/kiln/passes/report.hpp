// The compile report: what every pass did, every fusion and layout decision, the graph as
// lowered. Passes fill it in; the executor keeps it for the user to read.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/ir/graph.hpp"

namespace kiln {

/// One line of the compile report.
struct PassRecord {
  std::string name;
  bool ran = false; ///< false when disabled
  bool changed = false;
  std::int32_t nodes_before = 0, nodes_after = 0;
  std::vector<std::pair<std::string, std::int64_t>> stats;
  double milliseconds = 0.0;
};

/// Why the fusion pass did or did not merge a producer into a consumer (stable codes).
enum class FusionReason : std::uint8_t {
  fused,                ///< merged into the consumer's kernel
  several_consumers,    ///< its value is also read elsewhere: fusing would compute it twice
  graph_output,         ///< the user reads it after the run
  would_duplicate_work, ///< it is broadcast into a larger consumer: fusing recomputes it per
                        ///< element
  not_fusable,          ///< the producer is not an elementwise op (anchor, reduction, source)
  too_many_inputs,      ///< the fused kernel would read more tensors than a kernel takes
  consumer_taken,       ///< the consumer already carries another anchor's epilogue
  state_hazard,         ///< moving the anchor to its consumer would read an updated param
  read_too_early,       ///< the producer's value is read before the consumer runs
  measured_apart,       ///< the tuner measured the two kernels apart faster than fused
  no_kernel,            ///< the target has no kernel for the fused node
};

constexpr std::string_view fusion_reason_name(FusionReason r) {
  constexpr std::string_view names[] = {
      "fused",          "several_consumers", "graph_output",   "would_duplicate_work",
      "not_fusable",    "too_many_inputs",   "consumer_taken", "state_hazard",
      "read_too_early", "measured_apart",    "no_kernel"};
  return names[static_cast<std::size_t>(r)];
}

/// One fusion decision of one pass, in terms of the graph that pass saw (its text form, as
/// dumped before the pass, names them).
struct FusionDecision {
  ValueId producer = -1;
  ValueId consumer = -1;
  std::string producer_op, consumer_op;
  FusionReason reason = FusionReason::fused;
  std::string pass{};
};

/// Why the layout pass stored a group of activations the way it did (stable codes).
enum class LayoutReason : std::uint8_t {
  channels_last,      ///< its convolutions read NHWC in place; that saves more than the reorders
                      ///< at the group's edges cost
  reorders_cost_more, ///< the reorders at its edges would cost more than its convolutions save
  not_eligible,       ///< none of its convolutions has a channels-last kernel for its shape
  measured,           ///< the tuner measured this layout faster than the rule's choice
};

constexpr std::string_view layout_reason_name(LayoutReason r) {
  constexpr std::string_view names[] = {"channels_last", "reorders_cost_more", "not_eligible",
                                        "measured"};
  return names[static_cast<std::size_t>(r)];
}

/// The layout chosen for one group of activations that must share a layout (joined by
/// elementwise ops and pools), which convolutions read or write. Bytes are estimates of the
/// memory traffic the choice saves (the column matrices of the group's convolutions) and
/// costs (the reorders at its edges).
struct LayoutDecision {
  std::vector<ValueId> values; ///< in the graph the layout pass saw
  std::string layout;          ///< "NHWC" or "NCHW"
  LayoutReason reason = LayoutReason::not_eligible;
  std::int64_t saved_bytes = 0, reorder_bytes = 0;
};

/// How the winograd pass had one convolution multiply (in the graph it saw), with the time
/// its rule weighed for each choice: FLOPs over the share of the peak the target's kernel
/// reaches (Target::kernel_work), in units of the direct kernel's.
struct AlgorithmDecision {
  ValueId node = -1;
  std::string op;
  std::string algorithm;          ///< "winograd" or "direct"
  double winograd_relative = 1.0; ///< the Winograd kernel's predicted time over the direct one's
  bool measured = false;          ///< the tuner's choice, not the rule's
};

/// One reorder the layout pass inserted: `of` (a value of the graph it saw) from one layout
/// to another, and why.
struct LayoutTransform {
  ValueId of = -1;
  std::string from, to;
  std::int64_t elements = 0;
  std::string why;
  ValueId reorder = -1;    ///< the transpose it made, in the graph it returned
  std::string folded_into; ///< the op that now reorders as it reads or writes (fold_reorders)
};

/// One candidate of a tuned decision: the cost model's time for the kernels it changes, and the
/// time measured for them (negative where the tuner trusted the model and did not measure).
struct TuningCandidate {
  std::string choice; ///< e.g. "fuse", "apart", "NHWC"
  double predicted_ms = 0.0;
  double measured_ms = -1.0;
};

/// One decision the tuner weighed: the pass's key for it, what the rule chose, what the
/// tuner kept, and each candidate's times (over the kernels the choice changes, per run).
struct TunedDecision {
  std::string key;         ///< as Decisions keys it, e.g. "epilogue %66 -> %70"
  std::string description; ///< e.g. "matmul %66 with its consumer fused_elementwise %70"
  std::string rule, chosen;
  std::vector<TuningCandidate> candidates;
};

/// What CompileOptions::tune did: whether it measured or read its cache, how long it took,
/// the whole step under the rules and as tuned, and every decision it weighed.
struct TuningReport {
  bool ran = false;        ///< tuning was asked for
  bool from_cache = false; ///< the decisions came from the cache file; nothing was measured
  std::string cache_file;
  std::string note;     ///< what the tuner concluded, or why it kept the rules
  double seconds = 0.0; ///< spent tuning (measuring the peak included), or reading the cache
  double rules_ms = 0.0, tuned_ms = 0.0; ///< median step time under each, measured side by side
  std::vector<TunedDecision> decisions;
};

/// Everything compilation learned: per pass records and fusion decisions.
struct CompileReport {
  std::vector<PassRecord> passes;
  std::vector<FusionDecision> fusion;
  std::vector<LayoutDecision> layouts;
  std::vector<LayoutTransform> transforms;
  std::vector<AlgorithmDecision> algorithms;
  TuningReport tuning;
  /// The graph as lowered, after every pass (draw it with to_dot, print it with to_text).
  std::shared_ptr<const Graph> optimised;

  /// The record of pass `name`, or nullptr.
  [[nodiscard]] const PassRecord* pass(std::string_view name) const {
    for (const PassRecord& p : passes)
      if (p.name == name) return &p;
    return nullptr;
  }
};

} // namespace kiln
