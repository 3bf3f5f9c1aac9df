include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
foreach(dir IN LISTS STOWAGE_PUBLIC_INCLUDE_DIRS)
  install(DIRECTORY ${dir}/stowage DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()
install(TARGETS stowage stowage_static EXPORT stowageTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS stowage_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT stowageTargets NAMESPACE stowage:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/stowage)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/stowageConfig.cmake.in
  ${PROJECT_BINARY_DIR}/stowageConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/stowage)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/stowageConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/stowageConfig.cmake ${PROJECT_BINARY_DIR}/stowageConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/stowage)
