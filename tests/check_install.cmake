# cmake --install into a scratch prefix, then use the installed package as consumers do: a CMake
# consumer of the shared library with fmt/spdlog/nlohmann_json/CUDA hidden, one of both libraries,
# the examples (built and run), and a pkg-config build.
file(REMOVE_RECURSE ${WORK})
macro(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endmacro()
set(prefix ${WORK}/prefix)
run(${CMAKE_COMMAND} --install ${BUILD} --prefix ${prefix})
foreach(f include/stowage/device.hpp include/stowage/stowage.h include/stowage/caching_allocator.hpp
          include/stowage/precision.hpp include/stowage/offload.hpp bin/stowage lib/pkgconfig/stowage.pc
          lib/cmake/stowage/stowageTargets.cmake lib/cmake/stowage/stowageStaticTargets.cmake
          share/doc/stowage/README.md share/doc/stowage/architecture.md share/doc/stowage/examples/quickstart.cpp)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()

run(${CMAKE_COMMAND} -S ${SRC}/tests/install_consumer -B ${WORK}/shared -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_FIND_PACKAGE_fmt=ON -DCMAKE_DISABLE_FIND_PACKAGE_spdlog=ON
    -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
run(${CMAKE_COMMAND} --build ${WORK}/shared -j2)
run(${CMAKE_COMMAND} -S ${SRC}/tests/install_consumer -B ${WORK}/static -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_BUILD_TYPE=Release -DSTATIC=ON)
run(${CMAKE_COMMAND} --build ${WORK}/static -j2)
foreach(exe shared/consumer_shared static/consumer_shared static/consumer_static)
  run(${WORK}/${exe})
  if(NOT out MATCHES "round trip ok")
    message(FATAL_ERROR "${exe}: ${out}")
  endif()
endforeach()

# The examples, as a user builds them from the installed docs.
run(${CMAKE_COMMAND} -S ${prefix}/share/doc/stowage/examples -B ${WORK}/examples -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK}/examples -j2)
run(${CMAKE_COMMAND} -E env STOWAGE_LOG_LEVEL=off ${WORK}/examples/quickstart)
if(NOT out MATCHES "quickstart: all checks passed")
  message(FATAL_ERROR "quickstart: ${out}")
endif()
message(STATUS "${out}")

# pkg-config, shared.
find_program(PKG_CONFIG pkg-config)
find_program(CXX_COMPILER c++)
if(PKG_CONFIG AND CXX_COMPILER)
  set(ENV{PKG_CONFIG_PATH} ${prefix}/lib/pkgconfig)
  run(${PKG_CONFIG} --cflags --libs stowage)
  separate_arguments(flags UNIX_COMMAND "${out}")
  run(${CXX_COMPILER} ${SRC}/tests/install_consumer/main.cpp ${flags} -Wl,-rpath,${prefix}/lib -o ${WORK}/pc_consumer)
  run(${WORK}/pc_consumer)
  if(NOT out MATCHES "round trip ok")
    message(FATAL_ERROR "pkg-config consumer: ${out}")
  endif()
endif()
message(STATUS "installed package works")
