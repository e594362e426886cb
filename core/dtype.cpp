// Names and sizes of the element types, in one place so messages and file formats agree.
#include "core/dtype.h"

#include <iterator>

#include "core/error.h"

namespace minidl {

namespace {

struct DTypeInfo {
  DType type;
  size_t size;
  const char* name;
};

// Every dtype in the order of its enum, so that a dtype's value indexes the table.
constexpr DTypeInfo kDTypes[] = {
    {DType::f32, 4, "f32"}, {DType::f64, 8, "f64"}, {DType::f16, 2, "f16"},   {DType::i32, 4, "i32"},
    {DType::i64, 8, "i64"}, {DType::u8, 1, "u8"},   {DType::boolean, 1, "bool"}, {DType::bf16, 2, "bf16"},
};

constexpr bool table_in_enum_order() {
  for (size_t i = 0; i < std::size(kDTypes); ++i) {
    if (static_cast<size_t>(kDTypes[i].type) != i) return false;
  }
  return true;
}
static_assert(table_in_enum_order(), "kDTypes must list the dtypes in the order of DType");

// nullptr for a value outside the enum.
const DTypeInfo* info(DType t) {
  const auto i = static_cast<size_t>(t);
  return i < std::size(kDTypes) ? &kDTypes[i] : nullptr;
}

}  // namespace

size_t dtype_size(DType t) {
  const DTypeInfo* d = info(t);
  return d != nullptr ? d->size : 0;
}

const char* dtype_name(DType t) {
  const DTypeInfo* d = info(t);
  return d != nullptr ? d->name : "?";
}

bool is_floating(DType t) { return t == DType::f32 || t == DType::f64 || is_float16(t); }

bool is_float16(DType t) { return t == DType::f16 || t == DType::bf16; }

DType dtype_from_name(const std::string& name) {
  for (const DTypeInfo& d : kDTypes) {
    if (name == d.name) return d.type;
  }
  MINIDL_FAIL("unknown dtype '", name, "': expected one of f32, f64, f16, bf16, i32, i64, u8, bool");
}

}  // namespace minidl
