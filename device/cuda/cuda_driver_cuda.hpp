#pragma once
// The driver's virtual-memory entry points, looked up at run time through the runtime
// (cudaGetDriverEntryPointByVersion) so that nothing links libcuda: binaries start on machines
// with the toolkit but no driver. <cuda.h> is used for types only.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>

namespace stowage::detail {

struct DriverApi {
  PFN_cuGetErrorName_v6000 getErrorName = nullptr;
  PFN_cuDeviceGet_v2000 deviceGet = nullptr;
  PFN_cuDeviceGetAttribute_v2000 deviceGetAttribute = nullptr;
  PFN_cuMemAddressReserve_v10020 memAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 memAddressFree = nullptr;
  PFN_cuMemCreate_v10020 memCreate = nullptr;
  PFN_cuMemRelease_v10020 memRelease = nullptr;
  PFN_cuMemMap_v10020 memMap = nullptr;
  PFN_cuMemUnmap_v10020 memUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 memSetAccess = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 memGetAllocationGranularity = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 memExportToShareableHandle = nullptr;

  bool complete = false;  // every entry point above was found
  std::string missing;    // why not, when !complete
};

// Looked up once per process; never throws.
const DriverApi& driver_api();

// The driver's name for a result ("CUDA_ERROR_OUT_OF_MEMORY"), or its number.
std::string driver_error_name(CUresult result);

}  // namespace stowage::detail
