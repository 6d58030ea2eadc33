// The all-reduce of data-parallel training as two ops, so that the scheduler places its start
// as soon as a bucket of gradients exists and its wait as late as the updates allow, and the
// memory planner keeps the bucket alive exactly from one to the other.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "kiln/ops/builders.hpp"
#include "kiln/ops/op_def.hpp"

namespace kiln {

/// allreduce_start(g0, g1, ...): packs the gradients of one bucket side by side into a flat
/// [total] buffer and starts summing it over the communicator's ranks (collective `slot`).
/// Its value is only to be read by allreduce_wait.
template <> struct OpDef<Op::AllreduceStart> : OpDefaults {
  static constexpr int arity = -1;
  static constexpr FusionKind kind = FusionKind::opaque;
  static constexpr SchedulePriority schedule = SchedulePriority::first;
  /// Moves data, computes nothing here (the sum runs on the communicator).
  static std::int64_t flops(const CostContext&) { return 0; }
  static TensorType infer(const InferContext& c) {
    const auto& a = c.attr<CollectiveAttrs>();
    if (!a.communicator) c.fail(errc::attr, "no communicator");
    if (c.arity() < 1) c.fail(errc::arity, "needs at least one tensor");
    std::int64_t total = 0;
    for (int i = 0; i < c.arity(); ++i) {
      c.expect_dtype(i, DType::f32);
      total += c.in(i).shape.numel();
    }
    return TensorType{Shape{total}, DType::f32};
  }
  static constexpr GradFn grad = nullptr;
};

/// allreduce_wait(started): waits for the all-reduce allreduce_start began and divides by the
/// number of ranks: the bucket's gradients averaged over every rank, still packed.
template <> struct OpDef<Op::AllreduceWait> : OpDefaults {
  static constexpr int arity = 1;
  static constexpr FusionKind kind = FusionKind::opaque;
  static constexpr SchedulePriority schedule = SchedulePriority::last;
  static TensorType infer(const InferContext& c) {
    if (!c.attr<CollectiveAttrs>().communicator) c.fail(errc::attr, "no communicator");
    return c.in(0);
  }
  /// The scaling reads each element before writing it in place.
  static int overwritable_input(const Attrs&) { return 0; }
  static constexpr GradFn grad = nullptr;
};

inline Value allreduce_start(const std::vector<Value>& gradients, const CollectiveAttrs& attrs) {
  if (gradients.empty()) fail(errc::argument, "allreduce_start: no gradients");
  std::vector<ValueId> ids;
  for (const Value& v : gradients) {
    if (!v.valid() || v.graph != gradients[0].graph)
      fail(errc::argument, "allreduce_start: values must belong to one graph");
    ids.push_back(v.id);
  }
  return append(*gradients[0].graph, Op::AllreduceStart, std::move(ids), attrs);
}

inline Value allreduce_wait(Value started) {
  if (!started.valid()) fail(errc::argument, "allreduce_wait: empty value");
  const Node& start = started.graph->node(started.id);
  if (start.op != Op::AllreduceStart)
    fail(errc::argument, "allreduce_wait: reads what allreduce_start returned");
  return append(*started.graph, Op::AllreduceWait, {started.id}, start.attrs);
}

/// The average over every rank of each of `gradients`, by all-reduces of about `bucket_bytes`
/// each (at most max_op_inputs tensors), numbered from slot 0 in the order of `gradients`
/// (give the first computed first); returns the averaged gradients in the same order, and the
/// number of all-reduces made in `collectives`.
inline std::vector<Value> allreduce_mean(const std::vector<Value>& gradients,
                                         const std::shared_ptr<Communicator>& communicator,
                                         std::size_t bucket_bytes, int& collectives) {
  std::vector<Value> averaged(gradients.size());
  collectives = 0;
  std::size_t begin = 0;
  while (begin < gradients.size()) {
    std::size_t end = begin, bytes = 0;
    while (end < gradients.size() && end - begin < static_cast<std::size_t>(max_op_inputs) &&
           (end == begin || bytes < bucket_bytes)) {
      const TensorType& t = gradients[end].graph->node(gradients[end].id).type;
      bytes += static_cast<std::size_t>(t.shape.numel()) * dtype_size(t.dtype);
      ++end;
    }
    const std::vector<Value> bucket(gradients.begin() + static_cast<std::ptrdiff_t>(begin),
                                    gradients.begin() + static_cast<std::ptrdiff_t>(end));
    const Value done =
        allreduce_wait(allreduce_start(bucket, CollectiveAttrs{communicator, collectives++}));
    std::int64_t offset = 0;
    for (std::size_t i = begin; i < end; ++i) {
      // A copy: appending the part may move the graph's nodes.
      const Shape shape = gradients[i].graph->node(gradients[i].id).type.shape;
      averaged[i] = append(*done.graph, Op::Part, {done.id}, PartAttrs{offset, shape});
      offset += shape.numel();
    }
    begin = end;
  }
  return averaged;
}

} // namespace kiln
