# One training step of the BF16 example's default model per layout.
cutrain_add_bench(NAME bench_train SOURCES bench_train.cpp LIBS cutrain_model)
