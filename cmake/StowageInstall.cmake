# Installs the headers, both libraries, the command, the docs, a CMake package and a pkg-config
# file. The CMake package has two export sets: find_package(stowage) gives stowage::stowage (the
# shared library) and looks up only what its interface needs (Threads, DLPack);
# find_package(stowage COMPONENTS static) adds stowage::stowage_static and its link dependencies.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
foreach(dir IN LISTS STOWAGE_PUBLIC_INCLUDE_DIRS)
  install(DIRECTORY ${dir}/stowage DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()
install(TARGETS stowage EXPORT stowageTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS stowage_static EXPORT stowageStaticTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS stowage_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
set(stowage_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/stowage)
install(EXPORT stowageTargets NAMESPACE stowage:: DESTINATION ${stowage_cmake_dir})
install(EXPORT stowageStaticTargets NAMESPACE stowage:: DESTINATION ${stowage_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/stowageConfig.cmake.in
  ${PROJECT_BINARY_DIR}/stowageConfig.cmake INSTALL_DESTINATION ${stowage_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/stowageConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/stowageConfig.cmake ${PROJECT_BINARY_DIR}/stowageConfigVersion.cmake
  DESTINATION ${stowage_cmake_dir})

# pkg-config: `pkg-config --cflags --libs stowage` (shared), add --static for the archive.
set(stowage_pc_private "-lfmt -lspdlog -lnuma -lhwloc -ldl")
if(STOWAGE_HAVE_CUDA)
  string(APPEND stowage_pc_private " -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -lrt")
endif()
# Relocatable: the prefix is found from where the file lies.
file(RELATIVE_PATH stowage_pc_prefix ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
configure_file(${PROJECT_SOURCE_DIR}/cmake/stowage.pc.in ${PROJECT_BINARY_DIR}/stowage.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/stowage.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Documentation and the examples a new user copies.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
