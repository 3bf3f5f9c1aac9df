# capi_dlopen_test runs this helper: a plain C program linking nothing of stowage (nor jemalloc),
# so the process that dlopens libstowage.so is as bare as a Python interpreter loading it.
add_executable(capi_dlopen_helper ${CMAKE_CURRENT_SOURCE_DIR}/capi_dlopen_helper.c)
target_link_libraries(capi_dlopen_helper PRIVATE ${CMAKE_DL_LIBS})
if(TARGET capi_dlopen_test)
  add_dependencies(capi_dlopen_test capi_dlopen_helper stowage)
  target_compile_definitions(capi_dlopen_test PRIVATE STOWAGE_DLOPEN_HELPER="$<TARGET_FILE:capi_dlopen_helper>")
endif()
