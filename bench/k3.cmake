# bench_k3: cross-entropy, AdamW (three layouts, RNE and SR), grad norm (names match bench/peers/k3_peer.py).
cutrain_add_bench(NAME bench_k3 SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_k3.cu
                  LIBS cutrain_kernel_cross_entropy cutrain_kernel_adamw cutrain_kernel_reduce)
