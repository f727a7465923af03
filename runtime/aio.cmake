# runtime/aio: async tensor I/O (io_uring, libaio fallback, pread threads).
target_sources(cutrain_runtime PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/aio/io_queue.cpp
  ${CMAKE_CURRENT_LIST_DIR}/aio/uring_queue.cpp
  ${CMAKE_CURRENT_LIST_DIR}/aio/libaio_queue.cpp
  ${CMAKE_CURRENT_LIST_DIR}/aio/aio_handle.cpp
  ${CMAKE_CURRENT_LIST_DIR}/aio/aio_file.cpp
  ${CMAKE_CURRENT_LIST_DIR}/aio/gds_handle.cpp)
if(LibUring_FOUND)
  target_link_libraries(cutrain_runtime PUBLIC LibUring::uring)
  target_compile_definitions(cutrain_runtime PRIVATE CUTRAIN_HAVE_LIBURING=1)
endif()
if(LibAio_FOUND)
  target_link_libraries(cutrain_runtime PUBLIC LibAio::aio)
  target_compile_definitions(cutrain_runtime PRIVATE CUTRAIN_HAVE_LIBAIO=1)
endif()
if(CuFile_FOUND)
  target_link_libraries(cutrain_runtime PUBLIC CuFile::cufile)
  target_compile_definitions(cutrain_runtime PRIVATE CUTRAIN_HAVE_CUFILE=1)
endif()
