// DLPack export/import. Exported tensors hold a Storage handle in their manager context, so the
// bytes outlive every stowage view until the consumer calls the deleter.
#include "stowage/dlpack.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace stowage {

namespace {

// DLPack 0.8 added kDLBool (6); the Debian header (0.6) predates it.
constexpr std::uint8_t kBoolCode = 6;

struct ExportContext {
  DLManagedTensor managed{};
  Storage storage;
  std::vector<std::int64_t> shape, strides;
};

void delete_export(DLManagedTensor* self) { delete static_cast<ExportContext*>(self->manager_ctx); }

DLDataType to_dl(DType t) {
  const auto bits = static_cast<std::uint8_t>(itemsize(t) * 8);
  switch (t) {
    case DType::f32:
    case DType::f16:
    case DType::f64: return {kDLFloat, bits, 1};
    case DType::bf16: return {kDLBfloat, bits, 1};
    case DType::i8:
    case DType::i16:
    case DType::i32:
    case DType::i64: return {kDLInt, bits, 1};
    case DType::u8:
    case DType::u16: return {kDLUInt, bits, 1};
    case DType::boolean: return {kBoolCode, 8, 1};
  }
  throw InvalidArgument("to_dlpack: unknown dtype");
}

}  // namespace

DType dtype_from_dlpack(DLDataType t, const char* what) {
  if (t.lanes != 1) throw Unsupported(fmt::format("{}: vector dtypes ({} lanes) are not supported", what, t.lanes));
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 32) return DType::f32;
      if (t.bits == 16) return DType::f16;
      if (t.bits == 64) return DType::f64;
      break;
    case kDLBfloat:
      if (t.bits == 16) return DType::bf16;
      break;
    case kDLInt:
      if (t.bits == 8) return DType::i8;
      if (t.bits == 16) return DType::i16;
      if (t.bits == 32) return DType::i32;
      if (t.bits == 64) return DType::i64;
      break;
    case kDLUInt:
      if (t.bits == 8) return DType::u8;
      if (t.bits == 16) return DType::u16;
      break;
    case kBoolCode:
      if (t.bits == 8) return DType::boolean;
      break;
    default: break;
  }
  throw Unsupported(fmt::format("{}: dtype code {} with {} bits has no stowage dtype", what, t.code, t.bits));
}

DLManagedTensor* to_dlpack(const TensorView& view) {
  if (!view.defined()) throw InvalidArgument("to_dlpack: undefined view");
  (void)view.storage().data();  // InvalidArgument when its memory resource was destroyed
  if (!view.storage().resident())
    throw InvalidArgument(fmt::format("to_dlpack: storage is {}, not resident", to_string(view.storage().state())));
  auto ctx = std::make_unique<ExportContext>();
  ctx->storage = view.storage();
  ctx->shape = view.shape();
  ctx->strides = view.strides();
  const Device& device = view.storage().device();
  DLTensor& t = ctx->managed.dl_tensor;
  // Memory the host addresses as its own (the emulated device's) is CPU data to consumers.
  const auto type = static_cast<DLDeviceType>(device.properties().dlpack_device_type);
  t.device = type == kDLCPU ? DLDevice{kDLCPU, 0} : DLDevice{type, device.ordinal()};
  t.data = view.data();  // the first element; byte_offset 0 is what most consumers expect
  t.byte_offset = 0;
  t.ndim = view.dim();
  t.dtype = to_dl(view.dtype());
  t.shape = ctx->shape.data();
  t.strides = ctx->strides.data();
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = &delete_export;
  return &ctx.release()->managed;
}

TensorView from_dlpack(DLManagedTensor* tensor, Device& device) {
  // Validation comes first: on any error the caller keeps ownership of `tensor`.
  if (tensor == nullptr) throw InvalidArgument("from_dlpack: null tensor");
  const DLTensor& t = tensor->dl_tensor;
  switch (t.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost: break;
    case kDLCUDA:
    case kDLCUDAManaged:
      if (device.properties().dlpack_device_type != kDLCUDA || device.ordinal() != t.device.device_id)
        throw InvalidArgument(fmt::format("from_dlpack: CUDA device {} data given for {} device {}", t.device.device_id,
                                          to_string(device.kind()), device.ordinal()));
      break;
    default:
      throw Unsupported(
          fmt::format("from_dlpack: DLPack device type {} is not supported", static_cast<int>(t.device.device_type)));
  }
  if (t.ndim < 0) throw InvalidArgument("from_dlpack: negative ndim");
  const DType dtype = dtype_from_dlpack(t.dtype);
  const auto item = static_cast<std::int64_t>(itemsize(dtype));
  std::vector<std::int64_t> shape(t.shape, t.shape + t.ndim), strides;
  if (t.strides != nullptr) strides.assign(t.strides, t.strides + t.ndim);
  for (auto d : shape)
    if (d < 0) throw InvalidArgument("from_dlpack: negative dimension");
  // Empty when any dimension is 0, wherever it sits: the others' product may overflow.
  std::int64_t numel = std::find(shape.begin(), shape.end(), 0) != shape.end() ? 0 : 1;
  for (std::size_t i = 0; numel != 0 && i < shape.size(); ++i)
    if (__builtin_mul_overflow(numel, shape[i], &numel)) throw InvalidArgument("from_dlpack: the shape is too large");
  // The storage spans exactly the bytes the view reaches; negative strides reach below data.
  std::int64_t lo = 0, hi = 0;
  auto reach = [](std::int64_t stride, std::int64_t extent, std::int64_t& into) {
    std::int64_t r = 0;
    if (__builtin_mul_overflow(stride, extent, &r) || __builtin_add_overflow(into, r, &into))
      throw InvalidArgument("from_dlpack: the strides reach beyond the address space");
  };
  if (numel > 0 && !strides.empty())
    for (std::size_t i = 0; i < shape.size(); ++i) reach(strides[i], shape[i] - 1, strides[i] < 0 ? lo : hi);
  else if (numel > 0) hi = numel - 1;
  std::int64_t span = 0, below = 0;  // (hi - lo + 1) * item and -lo * item, checked
  if (numel > 0 && (__builtin_sub_overflow(hi, lo, &span) || __builtin_add_overflow(span, 1, &span) ||
                    __builtin_mul_overflow(span, item, &span) || __builtin_mul_overflow(lo, -item, &below)))
    throw InvalidArgument("from_dlpack: the strides reach beyond the address space");
  auto* first = static_cast<std::byte*>(t.data) + t.byte_offset;
  if (t.data == nullptr && numel > 0) throw InvalidArgument("from_dlpack: null data");
  std::byte* base = numel > 0 ? first - below : first;
  const std::size_t extent = numel > 0 ? static_cast<std::size_t>(span) : 0;
  const std::size_t offset = numel > 0 ? static_cast<std::size_t>(below) : 0;
  // Build the view before taking ownership, so a rejected shape leaves `tensor` with the caller.
  TensorView view(Storage::wrap(device, base, extent, nullptr), dtype, shape, strides, offset);
  Storage owned = Storage::wrap(device, base, extent, [tensor] {
    if (tensor->deleter != nullptr) tensor->deleter(tensor);
  });
  return TensorView(std::move(owned), dtype, std::move(shape), std::move(strides), offset);
}

}  // namespace stowage
