// nn::Module: the container every layer and model derives from. It owns named parameters, buffers
// and children in registration order, so state_dict keys come out exactly as PyTorch builds them
// ("layer1.0.conv1.weight") and checkpoints interchange with torchvision.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"

namespace minidl::nn {

// One row of Module::summary: a leaf module call during a forward on a batch of 1.
struct SummaryRow {
  std::string name;          // dotted path, as in state_dict keys ("layer1.0.conv1")
  std::string type;          // "Conv2d", "BatchNorm2d", ...
  Shape output_shape;        // with the batch dimension (1)
  int64_t num_parameters = 0;
  // Bytes the leaf's backward keeps alive: measured with memory_stats() (grad mode on, batch 1,
  // so per sample) by running the leaf on a private copy of its input that requires grad and
  // counting what stays allocated once the input and output handles are dropped. Includes the
  // input or output when the layer saves it (Conv2d saves its input, ReLU its output), so a
  // tensor saved by two consecutive layers counts in both rows: rows do not add up to the total.
  // Per-channel batch-norm statistics are a fixed cost per layer, counted here as if per sample.
  int64_t saved_bytes_per_sample = 0;
};

struct Summary {
  std::vector<SummaryRow> rows;      // one per leaf call, in call order (a reused ReLU appears twice)
  int64_t total_parameters = 0;
  // Bytes allocated by an ordinary forward and still held while its graph and output are alive
  // (what backward needs, each tensor once, including residual additions made outside leaves).
  int64_t total_saved_bytes_per_sample = 0;
  std::string str() const;           // the printable table
};

// How a state dict differs from a module's own: the keys it lacks, the keys the module does not
// have, and the entries whose shape or dtype differ ("fc.weight (expected f32[1, 128], got
// f32[2, 128])"), each in key order.
struct StateDictDiff {
  std::vector<std::string> missing, unexpected, mismatched;
  bool empty() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  // "122 missing keys [a, b, c, ...], 4 unexpected keys [...], 0 shape/dtype mismatches []": the
  // counts with the first `first` of each, one short line however large the model.
  std::string summary(size_t first = 3) const;
};

class Module {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation. Containers call their children through operator() (not forward) so summary()
  // sees every leaf call.
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x);

  const std::string& type_name() const { return type_name_; }

  // Registration: names must be unique within this module and contain no '.'. The returned
  // handle shares its TensorImpl with the registry, so in-place updates (to(), load_state_dict,
  // optimizer steps) are seen through both. Parameters become leaves that require grad.
  Tensor register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

  // Recursive, in PyTorch's order: a module's own entries, then each child's, depth first.
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  // This module (name "") and every descendant, pre-order, with dotted names.
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "");
  // A direct child by name; throws naming the available children when absent.
  std::shared_ptr<Module> child(const std::string& name) const;
  int64_t num_parameters() const;
  int64_t parameter_bytes() const;   // the parameters' storage in their own dtypes

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Moves every parameter, buffer and gradient to `device` in place: existing handles (an
  // optimizer's parameter list) see the new storage, and parameters stay leaves requiring grad.
  void to(Device device);
  // Converts every floating parameter, buffer and gradient to `dtype` in place, the same way
  // (handles stay valid, parameters stay leaves requiring grad); integer buffers such as
  // num_batches_tracked keep their dtype. Throws for a non-floating dtype. Used to compare against
  // float64 references where float32 rounding alone would flip a ReLU.
  Module& to(DType dtype);
  // PyTorch's model.to(memory_format=torch.channels_last): every 4-d parameter (convolution
  // weights, [out, in, kH, kW]) and its gradient get channels-last memory (KRSC), in place, so a
  // channels-last input runs cuDNN on NHWC descriptors with no per-call weight copy. Device and
  // dtype moves keep the format. Returns how many tensors changed format.
  int64_t to_channels_last();
  void zero_grad();  // drops .grad of every parameter (PyTorch's set_to_none=True)

  // Parameters then buffers per module, detached (sharing storage, no grad).
  std::map<std::string, Tensor> state_dict() const;
  // The same entries in PyTorch's state_dict order (std::map sorts its keys).
  std::vector<std::pair<std::string, Tensor>> ordered_state_dict() const;
  // Copies values in place (converting device, not dtype). strict: missing and unexpected keys are
  // errors; shape and dtype mismatches always are. One error lists every problem found.
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);
  // What load_state_dict would complain of, without loading anything.
  StateDictDiff compare_state_dict(const std::map<std::string, Tensor>& state) const;

  // Runs two forwards on zeros of input_shape with its batch dimension replaced by 1 (grad on, the
  // current train/eval mode, the parameters' device): a probe that reports one row per leaf call,
  // then an ordinary one for the total. Buffers (batch-norm statistics) are restored afterwards;
  // dropout layers do advance their generator.
  Summary summary(const Shape& input_shape);
  // True on this thread while summary() runs its probe forward: a model with fused paths (ResNet's
  // batch norm + ReLU) takes its module-by-module path then, so every leaf call gets its row.
  static bool summarizing();

 protected:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  // Called on this module and every descendant once to(Device) has moved their tensors: a module
  // that keeps device tensors outside its registry (a constant it reuses every forward) makes
  // them here, with the model, not at its first forward, which would place them among the first
  // step's activations (a run's first step then differs from every later one and from a trial's).
  virtual void moved_to(Device /*device*/) {}

 private:
  void collect_state(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out, bool params,
                     bool buffers, bool recurse) const;
  void check_new_name(const std::string& name, const char* what) const;

  std::string type_name_;
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace minidl::nn
