#pragma once
// Element types of tensor views.
#include <cstddef>
#include <cstdint>

namespace stowage {

enum class DType : std::uint8_t { f32, f16, bf16, f64, i8, i16, i32, i64, u8, u16, boolean };

std::size_t itemsize(DType t);
const char* to_string(DType t);

}  // namespace stowage
