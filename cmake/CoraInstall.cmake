# Install rules and the package config: find_package(cora) gives cora::cora (and cora::acl
# when built), cora::kernel_headers, cora::pack and cora_add_kernel_binary().
include(CMakePackageConfigHelpers)

set(CORA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/cora)
set_target_properties(cora_kernel_headers PROPERTIES EXPORT_NAME kernel_headers)
set(_cora_targets cora cora_kernel_headers cora_asio cora_uring)
if(TARGET cora-pack)
  set_target_properties(cora-pack PROPERTIES EXPORT_NAME pack)
  list(APPEND _cora_targets cora-pack)
endif()
if(TARGET cora_acl)
  set_target_properties(cora_acl PROPERTIES EXPORT_NAME acl)
  list(APPEND _cora_targets cora_acl)
endif()
install(TARGETS ${_cora_targets} EXPORT coraTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT coraTargets NAMESPACE cora:: DESTINATION ${CORA_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/coraConfig.cmake.in
  ${PROJECT_BINARY_DIR}/coraConfig.cmake INSTALL_DESTINATION ${CORA_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/coraConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/coraConfig.cmake ${PROJECT_BINARY_DIR}/coraConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/CoraKernels.cmake DESTINATION ${CORA_CMAKE_DIR})
