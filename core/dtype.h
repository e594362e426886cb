// Element types and the two 16-bit float storage types: f16 (IEEE binary16) and bf16 (bfloat16,
// the top half of an f32), so that tensors, copies and safetensors files carry them. Both compute
// in f32 and round once on store, each with its own round-to-nearest-even conversion.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace minidl {

// bf16 comes last so the values of the older dtypes stay what they were.
enum class DType : uint8_t { f32, f64, f16, i32, i64, u8, boolean, bf16 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);    // "f32", "f64", "f16", "bf16", "i32", "i64", "u8", "bool"
bool is_floating(DType t);
bool is_float16(DType t);   // f16 or bf16: 16-bit floats that compute in f32
DType dtype_from_name(const std::string& name);   // accepts the names above; throws otherwise

// IEEE 754 binary16, round-to-nearest-even on conversion from float.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a numeric type
  operator float() const { return to_float(bits); }  // NOLINT
  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
  static constexpr uint16_t kInfBits = 0x7c00;   // +inf; the positive non-NaN values are 1..kInfBits
};

// bfloat16: an f32 with its low 16 mantissa bits rounded off (round-to-nearest-even), so it has
// f32's range (no overflow where f32 has none) and 8 bits of precision. Subnormals round like any
// other value; inf stays inf; a NaN becomes the quiet NaN of its sign, as Half does.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a numeric type
  operator float() const { return to_float(bits); }  // NOLINT
  static uint16_t from_float(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) & 0x8000u) | 0x7fc0u;
    x += 0x7fffu + ((x >> 16) & 1u);  // ties go to the even upper half; past the largest finite: inf
    return static_cast<uint16_t>(x >> 16);
  }
  static float to_float(uint16_t b) {
    const uint32_t x = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
  }
  static constexpr uint16_t kInfBits = 0x7f80;
};

// Half or BFloat16: the storage types that compute in f32.
template <typename T>
inline constexpr bool is_float16_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

inline uint16_t Half::from_float(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // subnormal or zero in f16
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // value = mant24 * 2^(exp-150); f16 subnormal unit is 2^-24
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half_way = 1u << (shift - 1u);
    if (rem > half_way || (rem == half_way && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float Half::to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; mant <<= 1; } while ((mant & 0x400u) == 0);
      x = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 127u - 15u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace minidl
