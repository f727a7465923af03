# The caching allocator: CPU tests with the host source, GPU tests with the device/pinned sources.
cutrain_add_test(NAME test_allocator LABEL cpu SOURCES unit/test_allocator.cpp)
# SERIAL: EmptyCacheGivesMemoryBackToTheDevice reads cudaMemGetInfo's free memory, which other
# test processes moved by 4 MB during a 12-way parallel run on the H200 (session 2).
cutrain_add_test(NAME test_allocator_gpu LABEL gpu SERIAL SOURCES gpu/test_allocator_gpu.cpp)
