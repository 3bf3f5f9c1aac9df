#include "device/cuda/cuda_driver_cuda.hpp"

#include <cuda_runtime_api.h>

namespace stowage::detail {
namespace {

// 12.0 selects the ABI versions of the typedefs in DriverApi (unchanged since 10.2 / 6.0 / 2.0).
constexpr unsigned kEntryPointVersion = 12000;

template <class Fn>
void lookup(DriverApi& api, const char* symbol, Fn& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &p, kEntryPointVersion, cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || p == nullptr) {
    if (err != cudaSuccess) cudaGetLastError();
    if (api.missing.empty()) {
      api.missing = std::string(symbol) + " not found (" +
                    (err != cudaSuccess ? cudaGetErrorName(err) : "symbol not in driver") + ")";
    }
    return;
  }
  fn = reinterpret_cast<Fn>(p);
}

DriverApi load() {
  DriverApi api;
  lookup(api, "cuGetErrorName", api.getErrorName);
  lookup(api, "cuDeviceGet", api.deviceGet);
  lookup(api, "cuDeviceGetAttribute", api.deviceGetAttribute);
  lookup(api, "cuMemAddressReserve", api.memAddressReserve);
  lookup(api, "cuMemAddressFree", api.memAddressFree);
  lookup(api, "cuMemCreate", api.memCreate);
  lookup(api, "cuMemRelease", api.memRelease);
  lookup(api, "cuMemMap", api.memMap);
  lookup(api, "cuMemUnmap", api.memUnmap);
  lookup(api, "cuMemSetAccess", api.memSetAccess);
  lookup(api, "cuMemGetAllocationGranularity", api.memGetAllocationGranularity);
  lookup(api, "cuMemExportToShareableHandle", api.memExportToShareableHandle);
  api.complete = api.missing.empty();
  return api;
}

}  // namespace

const DriverApi& driver_api() {
  static const DriverApi api = load();
  return api;
}

std::string driver_error_name(CUresult result) {
  const char* name = nullptr;
  const auto get = driver_api().getErrorName;
  if (get != nullptr && get(result, &name) == CUDA_SUCCESS && name != nullptr) return name;
  return "CUresult " + std::to_string(static_cast<int>(result));
}

}  // namespace stowage::detail
