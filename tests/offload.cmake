# StateOffloader: CPU bookkeeping and errors; GPU round trips, memory movement, ordering.
cutrain_add_test(NAME test_offload LABEL cpu SOURCES unit/test_offload.cpp)
cutrain_add_test(NAME test_offload_gpu LABEL gpu SOURCES gpu/test_offload_gpu.cpp LIBS cutrain_offload_model)
