# cmake --install into a scratch prefix, then build and run a consumer with find_package(stowage).
if(NOT STOWAGE_SANITIZE)
  add_test(NAME install_consumer COMMAND ${CMAKE_COMMAND}
    -DBUILD=${PROJECT_BINARY_DIR} -DSRC=${PROJECT_SOURCE_DIR}/tests/install_consumer
    -DWORK=${PROJECT_BINARY_DIR}/install-test -P ${PROJECT_SOURCE_DIR}/tests/check_install.cmake)
  set_tests_properties(install_consumer PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE)
endif()
