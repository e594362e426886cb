// The autograd engine: builds nodes for differentiable ops and runs them in dependency order.
// Nodes are released after a backward pass (unless retain_graph), which frees saved activations:
// the memory experiments depend on this happening exactly when PyTorch would.
#include "core/autograd.h"

#include <atomic>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/ops.h"

namespace minidl {
namespace {

thread_local bool g_grad_enabled = true;
thread_local bool g_recomputing = false;
thread_local bool g_grad_hooks_enabled = true;
std::atomic<uint64_t> g_sequence{0};

// Only the engine holds g (one reference to its impl, one to its storage), in a plain dense
// layout from offset 0, not a leaf's or a graph's tensor: whoever takes it may write into it.
bool exclusively_held(const Tensor& g) {
  const bool dense = g.is_contiguous() || prefers_channels_last(g);
  return g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && dense && g.offset() == 0 && g.is_leaf() &&
         !g.requires_grad();
}

// The running node and the engine's inbox, for pending_grad (thread-local: a backward runs on
// the thread that called it; a nested backward, as checkpoint's, saves and restores it).
struct RunningNode {
  const Node* node = nullptr;
  std::unordered_map<Node*, std::vector<Tensor>>* inbox = nullptr;
  std::vector<const TensorImpl*>* handed = nullptr;   // per input: what pending_grad gave out
};
thread_local RunningNode g_running;

// A node whose backward is a closure; releasing it destroys the closure and its saved tensors.
class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, BackwardFn fn) : name_(name), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    MINIDL_CHECK(fn_ != nullptr, "backward: trying to backward through the graph a second time (node ", name_,
                 "): its saved tensors were freed after the first backward. Pass retain_graph=true to the first "
                 "backward() if you need to backward twice");
    return fn_(grads);
  }
  void release_saved() override { fn_ = nullptr; }

 private:
  std::string name_;
  BackwardFn fn_;
};

// The sink of a leaf: adds incoming gradients into leaf.grad (accumulation across backward calls
// is what gradient accumulation relies on).
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) { num_outputs = 1; }
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(const std::vector<Tensor>& grads) override {
    auto leaf = leaf_.lock();
    if (!leaf || !grads[0].defined()) return {};
    Tensor l(leaf);
    const Tensor& g = grads[0];
    MINIDL_CHECK(g.shape() == l.shape(), "backward: gradient ", g.meta(), " does not match leaf ", l.meta());
    if (!leaf->grad) {
      // Take the incoming gradient as it is when nothing else can see it (only the engine's inbox
      // holds it, its storage is its own, plain layout): that saves a parameter-sized copy per
      // leaf per step. Otherwise own a fresh copy (in g's format), since it may be shared.
      const bool unshared = exclusively_held(g) && g.dtype() == l.dtype();
      leaf->grad = unshared ? g.impl_ptr() : g.detach().to(l.dtype()).clone().impl_ptr();
    } else {
      Tensor(leaf->grad).add_(g.to(l.dtype()));
    }
    if (!grad_hooks_enabled()) return {};
    // A copy: a hook may remove itself (or others) while running.
    const auto hooks = leaf->post_accumulate_grad_hooks;
    for (const auto& h : hooks) h.second(l);
    return {};
  }

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

Edge edge_of(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn(), t.output_nr()};
  TensorImpl& impl = t.impl();
  auto acc = impl.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    acc->sequence_nr = g_sequence++;
    impl.grad_accumulator = acc;
  }
  return {acc, 0};
}

}  // namespace

Node::~Node() {
  thread_local bool tearing_down = false;
  thread_local std::vector<std::shared_ptr<Node>> pending;
  for (Edge& e : next_edges) {
    if (e.fn && e.fn.use_count() == 1) pending.push_back(std::move(e.fn));
  }
  next_edges.clear();
  if (tearing_down) return;
  tearing_down = true;
  while (!pending.empty()) {
    std::shared_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    n.reset();  // its destructor queues its own last references instead of recursing
  }
  tearing_down = false;
}

bool grad_enabled() { return g_grad_enabled; }
NoGradGuard::NoGradGuard() : ScopedFlag(g_grad_enabled, false) {}
EnableGradGuard::EnableGradGuard() : ScopedFlag(g_grad_enabled, true) {}

bool recomputing() { return g_recomputing; }
RecomputeGuard::RecomputeGuard() : ScopedFlag(g_recomputing, true) {}

bool grad_hooks_enabled() { return g_grad_hooks_enabled; }
GradHooksOffGuard::GradHooksOffGuard() : ScopedFlag(g_grad_hooks_enabled, false) {}

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor* t : inputs) {
    if (t && t->defined() && t->requires_grad()) return true;
  }
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs, BackwardFn fn) {
  if (!needs_grad(inputs)) return;
  auto node = std::make_shared<FunctionNode>(name, std::move(fn));
  node->sequence_nr = g_sequence++;
  node->num_outputs = static_cast<uint32_t>(outputs.size());
  node->next_edges.reserve(inputs.size());
  for (const Tensor& in : inputs) node->next_edges.push_back(edge_of(in));
  for (size_t i = 0; i < outputs.size(); ++i) {
    TensorImpl& o = outputs[i].impl();
    o.requires_grad = true;
    o.grad_fn = node;
    o.output_nr = static_cast<uint32_t>(i);
  }
}

Tensor pending_grad(size_t input) {
  if (g_running.node == nullptr || input >= g_running.node->next_edges.size()) return {};
  const Edge& e = g_running.node->next_edges[input];
  if (!e.fn) return {};
  const auto it = g_running.inbox->find(e.fn.get());
  if (it == g_running.inbox->end() || e.input_nr >= it->second.size()) return {};
  const Tensor& waiting = it->second[e.input_nr];
  if (!waiting.defined() || !exclusively_held(waiting)) return {};
  (*g_running.handed)[input] = &waiting.impl();
  return waiting;
}

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  MINIDL_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " roots but ", grads.size(), " gradients");
  NoGradGuard no_grad;  // backward computations are not recorded (no create_graph)

  // Count, for every node reachable from the roots, how many edges lead into it.
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::vector<Tensor>> inbox;
  std::vector<std::shared_ptr<Node>> visited;
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  std::vector<Edge> root_edges;
  for (size_t i = 0; i < roots.size(); ++i) {
    MINIDL_CHECK(roots[i].requires_grad(), "backward: tensor ", roots[i].meta(),
                 " does not require grad and has no grad_fn (did you build it under NoGradGuard, or forget "
                 "set_requires_grad(true) on the parameters?)");
    root_edges.push_back(edge_of(roots[i]));
  }
  for (const Edge& e : root_edges) {
    if (seen.insert(e.fn.get()).second) {
      visited.push_back(e.fn);
      stack.push_back(e.fn.get());
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.fn) continue;
      ++deps[e.fn.get()];
      if (seen.insert(e.fn.get()).second) {
        visited.push_back(e.fn);
        stack.push_back(e.fn.get());
      }
    }
  }

  // added_in: the backward returned, for this input, the waiting gradient pending_grad gave it,
  // which is already the sum. (The same tensor delivered twice otherwise, as x + x's backward
  // does, is added to itself.)
  auto deliver = [&](Node* n, uint32_t slot, const Tensor& g, bool added_in = false) {
    auto& box = inbox[n];
    if (box.empty()) box.resize(n->num_outputs);
    if (!box[slot].defined()) box[slot] = g;
    else if (!(added_in && box[slot].same(g))) box[slot] = add(box[slot], g);
  };
  auto cmp = [](Node* a, Node* b) { return a->sequence_nr < b->sequence_nr; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(cmp)> ready(cmp);
  for (size_t i = 0; i < roots.size(); ++i) deliver(root_edges[i].fn.get(), root_edges[i].input_nr, grads[i]);
  for (const Edge& e : root_edges) {
    if (deps[e.fn.get()] == 0) {
      deps[e.fn.get()] = -1;  // queued once
      ready.push(e.fn.get());
    }
  }

  try {
    while (!ready.empty()) {
      Node* n = ready.top();
      ready.pop();
      std::vector<Tensor> in = std::move(inbox[n]);
      inbox.erase(n);
      in.resize(n->num_outputs);
      bool any = false;
      for (const Tensor& t : in) any = any || t.defined();
      std::vector<Tensor> out;
      std::vector<const TensorImpl*> handed(n->next_edges.size(), nullptr);
      if (any) {
        const RunningNode outer = g_running;
        g_running = {n, &inbox, &handed};
        try {
          out = n->apply(in);
        } catch (...) {
          g_running = outer;
          throw;
        }
        g_running = outer;
      }
      if (!retain_graph) n->release_saved();  // free its saved tensors now, as PyTorch does, not at the end
      for (size_t i = 0; i < n->next_edges.size(); ++i) {
        const Edge& e = n->next_edges[i];
        if (!e.fn) continue;
        if (i < out.size() && out[i].defined()) deliver(e.fn.get(), e.input_nr, out[i], &out[i].impl() == handed[i]);
        if (--deps[e.fn.get()] == 0) ready.push(e.fn.get());
      }
    }
  } catch (...) {
    if (!retain_graph) {
      for (auto& n : visited) n->release_saved();
    }
    throw;
  }
  if (!retain_graph) {
    for (auto& n : visited) n->release_saved();
  }
}

}  // namespace minidl
