# Host-side alloc+free cost: caching allocator vs cudaMalloc vs cudaMallocAsync.
cutrain_add_bench(NAME bench_allocator SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_allocator.cpp)
