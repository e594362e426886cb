// GradScaler: PyTorch's per-optimizer stage machine (ready -> unscaled -> stepped -> update) and
// its scale update rule (_amp_update_scale_), with the scale held in f32 as PyTorch holds it.
#include "optim/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"

namespace minidl::optim {
namespace {

double scalar_of(const std::map<std::string, Tensor>& d, const std::string& key) {
  auto it = d.find(key);
  MINIDL_CHECK(it != d.end(), "GradScaler::load_state_dict: missing key '", key, "'");
  MINIDL_CHECK(it->second.defined() && it->second.numel() == 1, "GradScaler::load_state_dict: '", key,
               "' must hold one value, got ", it->second.defined() ? it->second.meta() : std::string("undefined"));
  return it->second.item();
}

constexpr const char* kPrefix = "scaler.";

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : o_(options), scale_(static_cast<float>(options.init_scale)) {
  MINIDL_CHECK(std::isfinite(o_.init_scale) && o_.init_scale > 0, "GradScaler: init_scale must be positive, got ",
               o_.init_scale);
  MINIDL_CHECK(o_.growth_factor > 1.0, "GradScaler: growth_factor should be > 1 (PyTorch's rule), got ",
               o_.growth_factor);
  MINIDL_CHECK(o_.backoff_factor > 0.0 && o_.backoff_factor < 1.0,
               "GradScaler: backoff_factor should be in (0, 1), got ", o_.backoff_factor);
  MINIDL_CHECK(o_.growth_interval > 0, "GradScaler: growth_interval must be > 0, got ", o_.growth_interval);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!o_.enabled) return loss;
  MINIDL_CHECK(loss.defined() && is_floating(loss.dtype()), "GradScaler::scale: expects a floating loss, got ",
               loss.defined() ? loss.meta() : std::string("an undefined tensor"));
  const Tensor l = loss.dtype() == DType::f16 ? loss.to(DType::f32) : loss;
  if (device_state()) return l * dev_scale_;   // no host value in a captured step
  return l * static_cast<double>(scale_);
}

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!o_.enabled) return;
  PerOptimizer& st = per_opt_[&optimizer];
  MINIDL_CHECK(st.stage != Stage::Unscaled, "GradScaler::unscale_: unscale_() has already been called on this ",
               "optimizer since the last update(); call it at most once per step (clip after the one call)");
  MINIDL_CHECK(st.stage != Stage::Stepped, "GradScaler::unscale_: unscale_() is being called after step(); "
               "call update() first, or unscale before step()");
  if (device_state()) {
    std::vector<Tensor> grads;
    for (const ParamGroup& g : optimizer.param_groups()) {
      for (const Tensor& p : g.params) {
        const Tensor grad = p.grad();
        if (!grad.defined()) continue;
        MINIDL_CHECK(grad.device() == dev_found_.device(), "GradScaler::unscale_: the device state is on ",
                     dev_found_.device().str(), " but a gradient is on ", grad.device().str());
        grads.push_back(grad);
      }
    }
    NoGradGuard no_grad;
    dev_found_.zero_();
    if (!grads.empty()) backend(dev_found_.device()).unscale_grads_device(grads, dev_scale_, dev_found_);
    st.found_inf = false;   // known on the device only
    st.checked = !grads.empty();
    st.stage = Stage::Unscaled;
    return;
  }
  // 1/scale in double, rounded to f32, as PyTorch does.
  const double inv = static_cast<double>(static_cast<float>(1.0 / static_cast<double>(scale_)));
  std::vector<std::pair<Device, std::vector<Tensor>>> by_device;  // one fused pass per device
  for (const ParamGroup& g : optimizer.param_groups()) {
    for (const Tensor& p : g.params) {
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      auto it = std::find_if(by_device.begin(), by_device.end(),
                             [&](const auto& e) { return e.first == grad.device(); });
      if (it == by_device.end()) {
        by_device.push_back({grad.device(), {}});
        it = by_device.end() - 1;
      }
      it->second.push_back(grad);
    }
  }
  bool found = false;
  NoGradGuard no_grad;
  for (auto& [device, grads] : by_device) {
    Tensor flag = zeros({1}, {DType::f32, device, false});
    backend(device).unscale_grads(grads, inv, flag);
    found = found || flag.item() != 0.0;
  }
  st.found_inf = found;
  st.checked = !by_device.empty();
  st.stage = Stage::Unscaled;
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!o_.enabled) {
    optimizer.step();
    return true;
  }
  auto it = per_opt_.find(&optimizer);
  if (it == per_opt_.end() || it->second.stage == Stage::Ready) {
    unscale_(optimizer);
    it = per_opt_.find(&optimizer);
  }
  PerOptimizer& st = it->second;
  MINIDL_CHECK(st.stage != Stage::Stepped, "GradScaler::step: step() has already been called since the last "
               "update(); call update() once per step");
  MINIDL_CHECK(st.checked, "GradScaler::step: no inf checks were recorded for this optimizer: none of its ",
               "parameters has a gradient (call backward on the scaled loss first)");
  st.stage = Stage::Stepped;
  if (device_state()) {
    // The fused kernels read the flag and skip on it: the decision never reaches the host.
    struct Clear {
      Optimizer& o;
      ~Clear() { o.set_skip_flag(Tensor()); }
    } clear{optimizer};
    optimizer.set_skip_flag(dev_found_);
    optimizer.step();
    return true;
  }
  if (st.found_inf) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!o_.enabled) return;
  bool any = false, found = false;
  for (const auto& [opt, st] : per_opt_) {
    if (st.stage == Stage::Ready || !st.checked) continue;
    any = true;
    found = found || st.found_inf;
  }
  MINIDL_CHECK(any, "GradScaler::update: no inf checks were recorded prior to update(); call step(optimizer) (or "
               "unscale_) after backward and before update()");
  if (device_state()) {
    NoGradGuard no_grad;
    backend(dev_scale_.device())
        .update_scale_device(dev_scale_, dev_tracker_, dev_found_, o_.growth_factor, o_.backoff_factor,
                             o_.growth_interval);
    per_opt_.clear();
    return;
  }
  // PyTorch's _amp_update_scale_.
  if (found) {
    scale_ = static_cast<float>(static_cast<double>(scale_) * o_.backoff_factor);
    growth_tracker_ = 0;
  } else {
    const int64_t successful = growth_tracker_ + 1;
    if (successful == o_.growth_interval) {
      const float grown = static_cast<float>(static_cast<double>(scale_) * o_.growth_factor);
      if (std::isfinite(grown)) scale_ = grown;
      growth_tracker_ = 0;
    } else {
      growth_tracker_ = successful;
    }
  }
  per_opt_.clear();
}

void GradScaler::update(double new_scale) {
  if (!o_.enabled) return;
  MINIDL_CHECK(std::isfinite(new_scale) && new_scale > 0, "GradScaler::update: new scale ", new_scale,
               " must be positive and finite");
  scale_ = static_cast<float>(new_scale);
  if (device_state()) dev_scale_.fill_(static_cast<double>(scale_));
  per_opt_.clear();
}

void GradScaler::to_device_state(Device device) {
  // meta:cuda too: the dry run of a graphed run (no values; its reads give the host's state).
  MINIDL_CHECK(device.target() == DeviceType::CUDA, "GradScaler::to_device_state: the device state is for CUDA "
               "graphs; got ", device.str());
  if (!o_.enabled) return;
  MINIDL_CHECK(per_opt_.empty(), "GradScaler::to_device_state: call it between steps (after update())");
  NoGradGuard no_grad;
  dev_scale_ = full({}, static_cast<double>(scale_), {DType::f32, device, false});
  dev_tracker_ = full({1}, static_cast<double>(growth_tracker_), {DType::i32, device, false});
  dev_found_ = zeros({1}, {DType::f32, device, false});
}

void GradScaler::to_host_state() {
  if (!device_state()) return;
  if (!valued()) {
    dev_scale_ = dev_tracker_ = dev_found_ = Tensor();
    return;
  }
  scale_ = static_cast<float>(dev_scale_.item());
  growth_tracker_ = static_cast<int64_t>(dev_tracker_.item());
  dev_scale_ = dev_tracker_ = dev_found_ = Tensor();
}

int64_t GradScaler::growth_tracker() const {
  return valued() ? static_cast<int64_t>(dev_tracker_.item()) : growth_tracker_;
}

double GradScaler::get_scale() const {
  if (!o_.enabled) return 1.0;
  return valued() ? dev_scale_.item() : static_cast<double>(scale_);
}

void GradScaler::set_found_inf(const Optimizer& optimizer, bool found) {
  if (!o_.enabled) return;
  auto it = per_opt_.find(&optimizer);
  MINIDL_CHECK(it != per_opt_.end() && it->second.stage == Stage::Unscaled, "GradScaler::set_found_inf: call ",
               "unscale_() on this optimizer first (the flag belongs to the step being unscaled)");
  it->second.found_inf = found;
  it->second.checked = true;
  if (device_state()) dev_found_.fill_(found ? 1.0 : 0.0);
}

bool GradScaler::found_inf(const Optimizer& optimizer) const {
  auto it = per_opt_.find(&optimizer);
  if (it == per_opt_.end() || it->second.stage == Stage::Ready) return false;
  return valued() ? dev_found_.item() != 0.0 : it->second.found_inf;
}

std::map<std::string, Tensor> GradScaler::state_dict() const {
  if (!o_.enabled) return {};
  const TensorOptions f64{DType::f64, Device::cpu(), false};
  const TensorOptions i64{DType::i64, Device::cpu(), false};
  return {{"scale", scalar_tensor(get_scale(), f64)},
          {"growth_factor", scalar_tensor(o_.growth_factor, f64)},
          {"backoff_factor", scalar_tensor(o_.backoff_factor, f64)},
          {"growth_interval", scalar_tensor(static_cast<double>(o_.growth_interval), i64)},
          {"_growth_tracker", scalar_tensor(static_cast<double>(growth_tracker()), i64)}};
}

void GradScaler::load_state_dict(const std::map<std::string, Tensor>& dict) {
  if (!o_.enabled) return;
  MINIDL_CHECK(!dict.empty(), "GradScaler::load_state_dict: the source state dict is empty, possibly because it was "
               "saved from a disabled GradScaler");
  const double scale = scalar_of(dict, "scale");
  const double growth = scalar_of(dict, "growth_factor");
  const double backoff = scalar_of(dict, "backoff_factor");
  const double interval = scalar_of(dict, "growth_interval");
  const double tracker = scalar_of(dict, "_growth_tracker");
  MINIDL_CHECK(std::isfinite(scale) && scale > 0 && growth > 1.0 && backoff > 0.0 && backoff < 1.0 &&
                   interval >= 1 && tracker >= 0 && tracker < interval,
               "GradScaler::load_state_dict: invalid values (scale ", scale, ", growth_factor ", growth,
               ", backoff_factor ", backoff, ", growth_interval ", interval, ", _growth_tracker ", tracker, ")");
  for (const auto& [k, v] : dict) {
    MINIDL_CHECK(k == "scale" || k == "growth_factor" || k == "backoff_factor" || k == "growth_interval" ||
                     k == "_growth_tracker",
                 "GradScaler::load_state_dict: unknown key '", k, "'");
  }
  scale_ = static_cast<float>(scale);
  o_.init_scale = scale;
  o_.growth_factor = growth;
  o_.backoff_factor = backoff;
  o_.growth_interval = static_cast<int64_t>(interval);
  growth_tracker_ = static_cast<int64_t>(tracker);
  if (device_state()) {
    dev_scale_.fill_(static_cast<double>(scale_));
    dev_tracker_.fill_(static_cast<double>(growth_tracker_));
  }
  per_opt_.clear();
}

std::map<std::string, Tensor> training_state_dict(const Optimizer& optimizer, const GradScaler& scaler) {
  std::map<std::string, Tensor> d = optimizer.state_dict();
  for (auto& [k, v] : scaler.state_dict()) d[kPrefix + k] = v;
  return d;
}

void load_training_state(Optimizer& optimizer, GradScaler& scaler, const std::map<std::string, Tensor>& dict) {
  std::map<std::string, Tensor> opt, sc;
  const std::string prefix = kPrefix;
  for (const auto& [k, v] : dict) {
    if (k.rfind(prefix, 0) == 0) {
      sc[k.substr(prefix.size())] = v;
    } else {
      opt[k] = v;
    }
  }
  // Validate the scaler part on a copy first so a bad dict leaves both untouched.
  GradScaler check(scaler.options());
  check.load_state_dict(sc);
  optimizer.load_state_dict(opt);
  scaler.load_state_dict(sc);
}

}  // namespace minidl::optim
