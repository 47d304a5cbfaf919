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
foreach(tool cora-info cora-inspect cora-roundtrip)
  if(TARGET ${tool})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()
# --- the CANN toolkit layout ------------------------------------------------------------------
# <prefix>/lib64/libacl_rt.so (CANN's library path, whatever CMAKE_INSTALL_LIBDIR is), with
# libascendcl.so, the name older CANN projects link, pointing at it; <prefix>/include/acl/...
# (installed above); and ascendc.cmake where CANN projects look for it through ASCENDC_CMAKE_DIR.
if(TARGET acl_rt)
  set_target_properties(acl_rt PROPERTIES EXPORT_NAME acl_rt)
  install(TARGETS acl_rt EXPORT coraTargets LIBRARY DESTINATION lib64)
  install(CODE "execute_process(COMMAND \${CMAKE_COMMAND} -E create_symlink libacl_rt.so
    \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/lib64/libascendcl.so\")")
  foreach(dir compiler/tikcpp/ascendc_kernel_cmake tools/tikcpp/ascendc_kernel_cmake)
    file(RELATIVE_PATH CORA_ASCENDC_TO_CONFIG "/root/${dir}" "/root/${CORA_CMAKE_DIR}")
    file(RELATIVE_PATH CORA_ASCENDC_TO_PREFIX "/root/${dir}" "/root")
    string(MAKE_C_IDENTIFIER "${dir}" id)
    configure_file(${PROJECT_SOURCE_DIR}/cmake/ascendc.cmake ${PROJECT_BINARY_DIR}/${id}/ascendc.cmake @ONLY)
    install(FILES ${PROJECT_BINARY_DIR}/${id}/ascendc.cmake DESTINATION ${dir})
  endforeach()
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

# pkg-config: `pkg-config --cflags --libs cora` for the C++ library, `acl_rt` for the C API.
file(RELATIVE_PATH CORA_PC_TO_PREFIX "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
set(CORA_PC_DEFINES "")
if(CORA_HAS_CUDA)
  set(CORA_PC_DEFINES "-DCORA_HAS_CUDA=1")
endif()
# A static libcora needs its dependencies on the link line; a shared one carries them.
set(CORA_PC_LIBS "")
if(NOT BUILD_SHARED_LIBS)
  set(CORA_PC_LIBS "-luring -ldl -pthread")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/cora.pc.in ${PROJECT_BINARY_DIR}/cora.pc @ONLY)
configure_file(${PROJECT_SOURCE_DIR}/cmake/acl_rt.pc.in ${PROJECT_BINARY_DIR}/acl_rt.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/cora.pc ${PROJECT_BINARY_DIR}/acl_rt.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
