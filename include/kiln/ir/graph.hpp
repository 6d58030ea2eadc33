// The IR: a graph of single-output nodes in topological order, and Value handles to them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ir/attrs.hpp"
#include "kiln/ir/op_list.hpp"

namespace kiln {

/// Index of a node; node %i defines value %i.
using ValueId = std::int32_t;

/// Static type of a value: shape and element type.
struct TensorType {
  Shape shape;
  DType dtype = DType::f32;
  friend bool operator==(const TensorType&, const TensorType&) = default;
};

/// One operation. Inputs always refer to earlier nodes, so node order is a valid schedule.
struct Node {
  Op op = Op::Input;
  std::vector<ValueId> inputs;
  Attrs attrs;
  TensorType type;
  /// Set by the inplace pass: the input whose memory the node's output takes over (that input
  /// dies here), or -1 for memory of its own. For an update (assign), 1: its value was
  /// computed straight into the param, so the assign moves nothing.
  std::int8_t in_place_of = -1;
};

class Graph;

/// A handle to a value of a graph, what the builder functions take and return.
struct Value {
  Graph* graph = nullptr;
  ValueId id = -1;

  [[nodiscard]] bool valid() const { return graph != nullptr && id >= 0; }
  /// The defining node. The reference is invalidated when the graph grows: copy what you
  /// need before building more nodes.
  [[nodiscard]] const Node& node() const;
  /// By value, so it stays valid while further nodes are appended.
  [[nodiscard]] Shape shape() const { return node().type.shape; }
  [[nodiscard]] DType dtype() const { return node().type.dtype; }
  friend bool operator==(const Value& a, const Value& b) {
    return a.graph == b.graph && a.id == b.id;
  }
};

/// A computation graph. Builder functions (kiln::add, kiln::conv2d, nn layers, autodiff)
/// append nodes through kiln::append (ops/registry.hpp), which checks shapes and dtypes at
/// once, so errors point at the line that built the bad node. Values hold a pointer to their
/// graph: a Graph does not move.
class Graph {
public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  /// A named input fed before each run, e.g. a batch of images. Every dimension must be >= 1
  /// and its size addressable (kiln.verify.shape otherwise).
  Value input(const std::string& name, Shape shape, DType dtype = DType::f32) {
    check_shape(shape, dtype_size(dtype), "input '" + name + "'");
    for (const Node& n : nodes_) {
      if (const auto* a = std::get_if<InputAttrs>(&n.attrs); a && a->name == name)
        fail(errc::argument, "graph already has an input named '" + name + "'");
    }
    return push(Node{Op::Input, {}, InputAttrs{name, 0}, TensorType{shape, dtype}});
  }

  /// A persistent tensor (parameter or state), read in place and updated by assign.
  Value param(const std::string& name, std::shared_ptr<Tensor> tensor) {
    if (!tensor) fail(errc::argument, "param '" + name + "' has no tensor");
    const TensorType type{tensor->shape(), tensor->dtype()};
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (const auto* a = std::get_if<ParamAttrs>(&nodes_[i].attrs); a && a->tensor == tensor)
        return Value{this, static_cast<ValueId>(i)};
    }
    return push(Node{Op::Param, {}, ParamAttrs{name, std::move(tensor)}, type});
  }

  /// Appends a node whose type is already known: kiln::append infers and checks it, passes
  /// that rewrite a graph copy it. Its inputs must be earlier nodes.
  Value push(Node node) {
    const auto id = static_cast<ValueId>(nodes_.size());
    for (ValueId in : node.inputs) {
      if (in < 0 || in >= id)
        fail(errc::graph, "node %" + std::to_string(id) + " " + std::string(op_name(node.op)) +
                              ": input %" + std::to_string(in) + " does not exist");
    }
    nodes_.push_back(std::move(node));
    return Value{this, id};
  }

  [[nodiscard]] const Node& node(ValueId id) const {
    return nodes_.at(static_cast<std::size_t>(id));
  }
  [[nodiscard]] Node& node(ValueId id) { return nodes_.at(static_cast<std::size_t>(id)); }
  [[nodiscard]] const std::vector<Node>& nodes() const { return nodes_; }
  [[nodiscard]] std::vector<Node>& nodes() { return nodes_; }
  [[nodiscard]] std::int32_t size() const { return static_cast<std::int32_t>(nodes_.size()); }
  [[nodiscard]] Value value(ValueId id) { return Value{this, id}; }

  /// Marks a value as a result: it is kept alive to the end of a run and readable after it.
  void mark_output(Value v) {
    check_owned(v, "mark_output");
    for (ValueId o : outputs_)
      if (o == v.id) return;
    outputs_.push_back(v.id);
  }
  [[nodiscard]] const std::vector<ValueId>& outputs() const { return outputs_; }
  [[nodiscard]] std::vector<ValueId>& outputs() { return outputs_; }

  /// The input node with this name; throws kiln.api.not_found.
  [[nodiscard]] ValueId find_input(const std::string& name) const {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (const auto* a = std::get_if<InputAttrs>(&nodes_[i].attrs); a && a->name == name)
        return static_cast<ValueId>(i);
    }
    fail(errc::not_found, "graph has no input named '" + name + "'");
  }

  /// A copy of the nodes and outputs, for passes that must not touch the user's graph.
  [[nodiscard]] std::unique_ptr<Graph> clone() const {
    auto copy = std::make_unique<Graph>();
    copy->nodes_ = nodes_;
    copy->outputs_ = outputs_;
    return copy;
  }

  /// Replaces every node and the outputs at once (passes rewrite graphs this way). The new
  /// nodes must be in topological order; Values taken before refer to the old numbering.
  void reset(std::vector<Node> nodes, std::vector<ValueId> outputs) {
    nodes_ = std::move(nodes);
    outputs_ = std::move(outputs);
  }

  void check_owned(Value v, const char* where) const {
    if (v.graph != this || v.id < 0 || v.id >= size())
      fail(errc::argument, std::string(where) + ": value does not belong to this graph");
  }

private:
  std::vector<Node> nodes_;
  std::vector<ValueId> outputs_;
};

inline const Node& Value::node() const {
  if (!valid()) fail(errc::argument, "use of an empty kiln::Value");
  return graph->node(id);
}

} // namespace kiln
