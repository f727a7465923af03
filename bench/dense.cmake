# bench_dense: layernorm, gelu, embedding (names match bench/peers/dense_peer.py).
cutrain_add_bench(NAME bench_dense SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_dense.cu
                  LIBS cutrain_kernel_layernorm cutrain_kernel_gelu cutrain_kernel_embedding)
