# cmake --install into a scratch prefix, then build and run consumers of it (tests/check_install.cmake).
if(NOT STOWAGE_SANITIZE)
  add_test(NAME install_consumer COMMAND ${CMAKE_COMMAND}
    -DBUILD=${PROJECT_BINARY_DIR} -DSRC=${PROJECT_SOURCE_DIR}
    -DWORK=${PROJECT_BINARY_DIR}/install-test -P ${PROJECT_SOURCE_DIR}/tests/check_install.cmake)
  set_tests_properties(install_consumer PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE)
endif()
