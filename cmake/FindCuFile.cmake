# Finds cuFile (GPUDirect Storage): cufile.h and libcufile, shipped with some CUDA installs.
# Defines CuFile_FOUND and the imported target CuFile::cufile.
find_path(CuFile_INCLUDE_DIR cufile.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
find_library(CuFile_LIBRARY NAMES cufile HINTS ${CUDAToolkit_LIBRARY_DIR})
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CuFile REQUIRED_VARS CuFile_LIBRARY CuFile_INCLUDE_DIR)
if(CuFile_FOUND AND NOT TARGET CuFile::cufile)
  add_library(CuFile::cufile UNKNOWN IMPORTED)
  set_target_properties(CuFile::cufile PROPERTIES IMPORTED_LOCATION "${CuFile_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${CuFile_INCLUDE_DIR}")
endif()
mark_as_advanced(CuFile_INCLUDE_DIR CuFile_LIBRARY)
