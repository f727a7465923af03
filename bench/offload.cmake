# Offload round trips (runtime/offload) against raw cudaMemcpyAsync; peer: bench/peers/offload_peer.py.
cutrain_add_bench(NAME bench_offload SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_offload.cpp)
