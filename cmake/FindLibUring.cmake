# Finds liburing (Debian: liburing-dev). Prefers the static archive so binaries built here
# run on machines without the shared library. Defines LibUring_FOUND and LibUring::uring.
find_path(LibUring_INCLUDE_DIR liburing.h)
find_library(LibUring_LIBRARY NAMES liburing.a uring)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(LibUring REQUIRED_VARS LibUring_LIBRARY LibUring_INCLUDE_DIR)
if(LibUring_FOUND AND NOT TARGET LibUring::uring)
  add_library(LibUring::uring UNKNOWN IMPORTED)
  set_target_properties(LibUring::uring PROPERTIES IMPORTED_LOCATION "${LibUring_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${LibUring_INCLUDE_DIR}")
endif()
mark_as_advanced(LibUring_INCLUDE_DIR LibUring_LIBRARY)
