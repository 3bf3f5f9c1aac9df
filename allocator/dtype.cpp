// Element sizes and names of tensor dtypes.
#include "stowage/dtype.hpp"

#include "stowage/error.hpp"

namespace stowage {

std::size_t itemsize(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f16:
    case DType::bf16:
    case DType::i16:
    case DType::u16: return 2;
    case DType::i8:
    case DType::u8:
    case DType::boolean: return 1;
  }
  throw InvalidArgument("itemsize: unknown dtype " + std::to_string(static_cast<int>(t)));
}

const char* to_string(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f64: return "f64";
    case DType::i8: return "i8";
    case DType::i16: return "i16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::u16: return "u16";
    case DType::boolean: return "bool";
  }
  return "unknown";
}

}  // namespace stowage
