# ZeRO in the engine: the pure plan (CPU) and world-size-1 bit-identity with a real NCCL
# communicator (GPU, skipped without a device or NCCL).
cutrain_add_test(NAME test_zero_plan LABEL cpu SOURCES unit/test_zero_plan.cpp LIBS cutrain_model)
# Stage 3's per-unit shard layout (CPU).
cutrain_add_test(NAME test_zero_shard_layout LABEL cpu SOURCES unit/test_zero_shard_layout.cpp LIBS cutrain_model)
cutrain_add_test(NAME test_zero_gpu LABEL gpu SOURCES gpu/test_zero_gpu.cpp LIBS cutrain_model)
# 2 ranks through `cutrain launch` against one process (skipped with fewer than 2 GPUs).
cutrain_add_cli_test(zero_cli zero_cli.sh)
