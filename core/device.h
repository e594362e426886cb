// Where a tensor lives. Ops pick their kernel by DeviceType; the index selects one GPU.
#pragma once
#include <ostream>
#include <string>

namespace minidl {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  // "cpu", "cuda", "cuda:1"; throws minidl::Error on anything else.
  static Device parse(const std::string& s);
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && (a.type == DeviceType::CPU || a.index == b.index);
  }
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

}  // namespace minidl
