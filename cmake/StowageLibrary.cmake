# libstowage (shared and static) from its layers (cmake/StowageLayers.cmake). Each layer is an
# OBJECT library: public headers in <layer>/include/stowage/, sources in <layer>/ and its
# subfolders. A layer links only the layers it uses, so an upward include does not compile:
# it sees the public headers of those layers alone, and root-relative private headers
# ("device/emulated/stream_worker.hpp") only through a view of its own folder and theirs.
# Files named *_cuda.cpp or *.cu are built only with the CUDA backend.
include(StowageLayers)
set(stowage_public_deps Threads::Threads dlpack::dlpack)
set(stowage_private_deps fmt::fmt spdlog::spdlog nlohmann_json::nlohmann_json
    PkgConfig::NUMA PkgConfig::HWLOC ${CMAKE_DL_LIBS})
if(STOWAGE_HAVE_CUDA)
  list(APPEND stowage_private_deps CUDA::cudart_static)
endif()

# Build facts that `stowage info` reports.
configure_file(${PROJECT_SOURCE_DIR}/cmake/build_info.hpp.in ${PROJECT_BINARY_DIR}/generated/stowage_build_info.hpp @ONLY)

# The folder a layer's root-relative private includes resolve in: links to its own folder and
# the folders of the layers below it, nothing else.
function(stowage_layer_view out layer)
  stowage_layer_closure(visible ${layer})
  set(view ${PROJECT_BINARY_DIR}/layer_views/${layer})
  file(REMOVE_RECURSE ${view})
  file(MAKE_DIRECTORY ${view})
  foreach(l IN LISTS visible)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${l} ${view}/${l} SYMBOLIC)
  endforeach()
  set(${out} ${view} PARENT_SCOPE)
endfunction()

# Thread-locals are reached through __tls_get_addr, not TLS descriptors (-mtls-dialect=gnu2):
# GCC keeps vector registers live across a descriptor call, and glibc before 2.40 clobbers them
# on the call's slow path (a dlopen'ed library's first thread-local access in a thread), which
# crashed the C ABI under Python on Debian 12 (glibc 2.36). The descriptors saved about 100 of
# 1,070 instructions of a cached C ABI pair.

set(stowage_all_objects)
set(STOWAGE_PUBLIC_INCLUDE_DIRS)
foreach(layer IN LISTS STOWAGE_LAYERS)
  file(GLOB_RECURSE layer_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${layer}/*.cpp)
  file(GLOB_RECURSE layer_cuda_cpp CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${layer}/*_cuda.cpp)
  if(layer_cuda_cpp)
    list(REMOVE_ITEM layer_sources ${layer_cuda_cpp})
  endif()
  if(STOWAGE_HAVE_CUDA)
    file(GLOB_RECURSE layer_cu CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${layer}/*.cu)
    list(APPEND layer_sources ${layer_cuda_cpp} ${layer_cu})
  endif()
  set(t stowage_${layer})
  add_library(${t} OBJECT ${layer_sources})
  stowage_layer_view(view ${layer})
  target_include_directories(${t}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/${layer}/include> $<INSTALL_INTERFACE:include>
    PRIVATE ${view} ${PROJECT_BINARY_DIR}/generated)
  foreach(used IN LISTS stowage_uses_${layer})
    target_link_libraries(${t} PUBLIC stowage_${used})
  endforeach()
  # -fno-semantic-interposition: the exported stowage:: functions are called (and inlined) directly
  # inside the library, not through the PLT as if a program could replace them.
  target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter
                                        -fno-semantic-interposition>)
  target_link_libraries(${t} PUBLIC ${stowage_public_deps} PRIVATE ${stowage_private_deps})
  target_compile_features(${t} PUBLIC cxx_std_20)
  if(STOWAGE_HAVE_CUDA)
    target_compile_definitions(${t} PUBLIC STOWAGE_HAVE_CUDA=1)
    target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
  endif()
  list(APPEND stowage_all_objects $<TARGET_OBJECTS:${t}>)
  list(APPEND STOWAGE_PUBLIC_INCLUDE_DIRS ${PROJECT_SOURCE_DIR}/${layer}/include)
endforeach()

add_library(stowage SHARED ${stowage_all_objects})
add_library(stowage_static STATIC ${stowage_all_objects})
# What a consumer gets: the public headers, C++20, Threads and DLPack's header. The rest (fmt,
# spdlog, numa, hwloc, the CUDA runtime) is private: only the static library's link needs it.
foreach(t stowage stowage_static)
  foreach(dir IN LISTS STOWAGE_PUBLIC_INCLUDE_DIRS)
    target_include_directories(${t} PUBLIC $<BUILD_INTERFACE:${dir}>)
  endforeach()
  target_include_directories(${t} PUBLIC $<INSTALL_INTERFACE:include>)
  target_compile_features(${t} PUBLIC cxx_std_20)
  target_link_libraries(${t} PUBLIC ${stowage_public_deps} PRIVATE ${stowage_private_deps})
endforeach()
set_target_properties(stowage PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
# Only stowage's own API leaves the shared library (tests/check_exports.cmake checks it).
target_link_options(stowage PRIVATE "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/stowage.map"
                    # calls between the library's own files bind inside it, with no PLT
                    "LINKER:-Bsymbolic-functions"
                    # dlclose never unmaps it: the process-wide devices' stream workers run its
                    # code until the process ends (tests/capi_dlopen_test.cpp)
                    "LINKER:-z,nodelete")
set_property(TARGET stowage APPEND PROPERTY LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/stowage.map)
set_target_properties(stowage_static PROPERTIES OUTPUT_NAME stowage)
add_library(stowage::stowage ALIAS stowage)
add_library(stowage::stowage_static ALIAS stowage_static)

# Links an executable of the project's own (a test, a benchmark, the command) against the objects
# of the given layers and every layer below them, and jemalloc at start-up, so the host pool's
# jemalloc arena is available (docs/host_pool.md). Such executables see every source folder.
function(stowage_link_layers target)
  stowage_layer_closure(layers ${ARGN})
  foreach(layer IN LISTS layers)
    target_sources(${target} PRIVATE $<TARGET_OBJECTS:stowage_${layer}>)
    target_include_directories(${target} PRIVATE $<TARGET_PROPERTY:stowage_${layer},INTERFACE_INCLUDE_DIRECTORIES>)
  endforeach()
  if(STOWAGE_HAVE_CUDA)
    target_compile_definitions(${target} PRIVATE STOWAGE_HAVE_CUDA=1)
  endif()
  target_link_libraries(${target} PRIVATE ${stowage_public_deps} ${stowage_private_deps})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/generated)
  if(STOWAGE_LINK_JEMALLOC)
    target_link_libraries(${target} PRIVATE PkgConfig::JEMALLOC)
  endif()
endfunction()
