# The `stowage` command. Its subcommands register themselves at static-initialisation time, so
# the tool sources form an OBJECT library (an archive would drop unreferenced registrations);
# tests link the same objects.
file(GLOB_RECURSE tools_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tools/*.cpp)
list(REMOVE_ITEM tools_sources ${PROJECT_SOURCE_DIR}/tools/main.cpp)
add_library(stowage_tools OBJECT ${tools_sources})
target_link_libraries(stowage_tools PUBLIC fmt::fmt nlohmann_json::nlohmann_json CLI11::CLI11 spdlog::spdlog Threads::Threads dlpack::dlpack)
target_include_directories(stowage_tools PUBLIC ${STOWAGE_PUBLIC_INCLUDE_DIRS} ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/generated)
target_compile_options(stowage_tools PRIVATE -Wall -Wextra -Wno-unused-parameter)
if(STOWAGE_HAVE_CUDA)
  target_compile_definitions(stowage_tools PUBLIC STOWAGE_HAVE_CUDA=1)
endif()
add_executable(stowage_cli ${PROJECT_SOURCE_DIR}/tools/main.cpp $<TARGET_OBJECTS:stowage_tools>)
set_target_properties(stowage_cli PROPERTIES OUTPUT_NAME stowage)
target_link_libraries(stowage_cli PRIVATE stowage_tools)
stowage_link_layers(stowage_cli ${STOWAGE_LAYERS})
