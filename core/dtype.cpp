// Names and sizes of the element types, in one place so messages and file formats agree.
#include "core/dtype.h"

#include "core/error.h"

namespace minidl {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::boolean: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::boolean: return "bool";
  }
  return "?";
}

bool is_floating(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::f16; }

DType dtype_from_name(const std::string& name) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::i32, DType::i64, DType::u8, DType::boolean}) {
    if (name == dtype_name(t)) return t;
  }
  MINIDL_FAIL("unknown dtype '", name, "': expected one of f32, f64, f16, i32, i64, u8, bool");
}

}  // namespace minidl
