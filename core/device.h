// Where a tensor lives. Ops pick their kernel by DeviceType; the index selects one GPU. The meta
// device holds shapes without storage: a training step on it is a dry run that measures memory
// through a model of the allocator of the device it stands for (its index names that target).
#pragma once
#include <cstdint>
#include <ostream>
#include <string>

namespace minidl {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1, Meta = 2 };
inline constexpr int kNumDeviceTypes = 3;

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;   // CUDA: the GPU; Meta: the DeviceType whose allocator and kernels it models

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  // The shape-only device standing for `target` (CPU or CUDA): see docs/memory.md.
  static Device meta(DeviceType target = DeviceType::CPU) { return {DeviceType::Meta, static_cast<int>(target)}; }
  // "cpu", "cuda", "cuda:1", "meta" (= "meta:cpu"), "meta:cuda"; throws minidl::Error on anything else.
  static Device parse(const std::string& s);
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool is_meta() const { return type == DeviceType::Meta; }
  // The device type whose behaviour this device has: itself, or a meta device's target.
  DeviceType target() const { return is_meta() ? static_cast<DeviceType>(index) : type; }
  std::string str() const;
  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && (a.type == DeviceType::CPU || a.index == b.index);
  }
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

}  // namespace minidl
