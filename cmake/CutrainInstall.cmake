# install(): the rooms' libraries as cutrain::<room>, their headers under include/cutrain/ (the
# same paths as in the tree: #include "runtime/aio/aio_handle.h"), the `cutrain` program, and a
# versioned cutrainConfig.cmake so that another project does find_package(cutrain 0.1) and links
# cutrain::runtime, cutrain::aio, cutrain::kernels, cutrain::train (examples/find_package/).
include(CMakePackageConfigHelpers)

# The async I/O engine lives in cutrain_runtime (runtime/aio/); cutrain::aio names that part for
# a project that wants the engine only.
add_library(cutrain_aio INTERFACE)
target_link_libraries(cutrain_aio INTERFACE cutrain_runtime)

get_target_property(_cutrain_kernel_families cutrain_kernels INTERFACE_LINK_LIBRARIES)
set(_cutrain_exported cutrain_options cutrain_runtime cutrain_aio ${_cutrain_kernel_families} cutrain_kernels
    cutrain_data cutrain_model cutrain_parallel cutrain_config cutrain_train)
foreach(t IN LISTS _cutrain_exported)
  string(REGEX REPLACE "^cutrain_" "" _name ${t})
  set_target_properties(${t} PROPERTIES EXPORT_NAME ${_name})
  add_library(cutrain::${_name} ALIAS ${t})
endforeach()

set(_cutrain_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/cutrain)
install(TARGETS ${_cutrain_exported} EXPORT cutrainTargets COMPONENT devel
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS cutrain COMPONENT runtime RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY runtime kernels data model parallel train DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cutrain
        COMPONENT devel FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
install(EXPORT cutrainTargets NAMESPACE cutrain:: DESTINATION ${_cutrain_cmake_dir} COMPONENT devel)

# What the config must find again: the optional libraries this build linked (their imported
# targets are in the exported link interface), through the same Find modules.
set(CUTRAIN_CONFIG_OPTIONAL "")
foreach(p LibUring LibAio NCCL CuFile)
  if(${p}_FOUND)
    list(APPEND CUTRAIN_CONFIG_OPTIONAL ${p})
    install(FILES ${PROJECT_SOURCE_DIR}/cmake/Find${p}.cmake DESTINATION ${_cutrain_cmake_dir} COMPONENT devel)
  endif()
endforeach()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/cutrainConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cutrainConfig.cmake INSTALL_DESTINATION ${_cutrain_cmake_dir})
# 0.x: a minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cutrainConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cutrainConfig.cmake ${PROJECT_BINARY_DIR}/cutrainConfigVersion.cmake
        DESTINATION ${_cutrain_cmake_dir} COMPONENT devel)
