# The Python package's tests (python/tests) under pytest, against this build's libstowage.so.
# STOWAGE_PYTHON picks the interpreter: Debian's /usr/bin/python3, where scripts/install-deps.sh
# installs python3-torch and python3-pytest, unless set. Not under sanitizers (an instrumented
# library cannot be loaded into an uninstrumented interpreter).
if(NOT STOWAGE_SANITIZE)
  find_program(STOWAGE_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
  find_program(STOWAGE_PYTHON NAMES python3)
  add_test(NAME python_package
    COMMAND ${STOWAGE_PYTHON} -m pytest -q -p no:cacheprovider ${PROJECT_SOURCE_DIR}/python/tests)
  set_tests_properties(python_package PROPERTIES TIMEOUT 900
    ENVIRONMENT "PYTHONPATH=${PROJECT_SOURCE_DIR}/python;STOWAGE_LIBRARY=$<TARGET_FILE:stowage>;STOWAGE_LOG_LEVEL=off")
endif()
