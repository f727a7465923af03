# The caching allocator: CPU tests with the host source, GPU tests with the device/pinned sources.
cutrain_add_test(NAME test_allocator LABEL cpu SOURCES unit/test_allocator.cpp)
cutrain_add_test(NAME test_allocator_gpu LABEL gpu SOURCES gpu/test_allocator_gpu.cpp)
