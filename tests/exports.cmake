# libstowage.so exports only stowage's API (tests/check_exports.cmake).
add_test(NAME exported_symbols COMMAND ${CMAKE_COMMAND} -DLIBRARY=$<TARGET_FILE:stowage>
  -P ${PROJECT_SOURCE_DIR}/tests/check_exports.cmake)
