# Integration tests with Python consumers. torch_dlpack.py checks torch.from_dlpack against
# stowage's DLPack export through a probe library it loads with ctypes; it reports itself
# skipped where PyTorch is not installed. Not in sanitizer builds: an instrumented library
# cannot be loaded into an uninstrumented Python.
# Debian's interpreter first: python3-torch installs into its dist-packages.
find_program(STOWAGE_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
find_program(STOWAGE_PYTHON3 python3)
if(STOWAGE_PYTHON3 AND NOT STOWAGE_SANITIZE)
  add_library(stowage_dlpack_probe MODULE ${CMAKE_CURRENT_SOURCE_DIR}/integration/dlpack_probe.cpp)
  target_link_libraries(stowage_dlpack_probe PRIVATE stowage)
  add_test(NAME torch_dlpack COMMAND ${STOWAGE_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/integration/torch_dlpack.py
    $<TARGET_FILE:stowage_dlpack_probe>)
  set_tests_properties(torch_dlpack PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 ENVIRONMENT "STOWAGE_LOG_LEVEL=off")
endif()
