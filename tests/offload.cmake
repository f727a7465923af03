# StateOffloader: CPU bookkeeping and errors; GPU round trips, memory movement, ordering. The GPU
# tests run alone (SERIAL): they check that cudaMemGetInfo's free memory moves.
cutrain_add_test(NAME test_offload LABEL cpu SOURCES unit/test_offload.cpp)
cutrain_add_test(NAME test_offload_gpu LABEL gpu SERIAL SOURCES gpu/test_offload_gpu.cpp LIBS cutrain_offload_model)
# `cutrain offload-bench` and scripts/offload-sweep.sh end to end (cpu: error paths; cuda: the
# output lines, the log, the table; skipped without a device).
cutrain_add_cli_test(offload_cli offload_cli.sh)
# GpuEngine::offload_states / reload_states (training continues bit-exactly, every layout).
cutrain_add_test(NAME test_offload_engine_gpu LABEL gpu SOURCES gpu/test_offload_engine_gpu.cpp LIBS cutrain_model)
# zero_optimization.offload_optimizer (nvme / cpu, pipelined or not) in GpuEngine: bit-identical to
# a resident run for every layout, the graph captured once, no device memory between steps.
cutrain_add_test(NAME test_optimizer_offload_gpu LABEL gpu SOURCES gpu/test_optimizer_offload_gpu.cpp LIBS cutrain_model)
