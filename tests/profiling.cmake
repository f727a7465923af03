# The training loop's profiling glue (model/step_profiler): FLOP count and step logic on the CPU,
# the timed window with its report on the GPU.
cutrain_add_test(NAME test_step_profiler LABEL cpu SOURCES unit/test_step_profiler.cpp LIBS cutrain_model)
cutrain_add_test(NAME test_step_profiler_gpu LABEL gpu SOURCES gpu/test_step_profiler_gpu.cpp gpu/spin_kernel.cu
                 LIBS cutrain_model)
