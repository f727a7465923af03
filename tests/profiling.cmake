# The training loop's profiling glue (model/step_profiler): FLOP count and step logic on the CPU,
# the timed window with its report on the GPU.
cutrain_add_test(NAME test_step_profiler LABEL cpu SOURCES unit/test_step_profiler.cpp LIBS cutrain_model)
# SERIAL: it checks region times of spin kernels (2 ms +- 0.17); with other test processes on the
# GPU the spin ran 2.18 ms (H200, session 3).
cutrain_add_test(NAME test_step_profiler_gpu LABEL gpu SERIAL SOURCES gpu/test_step_profiler_gpu.cpp
                 gpu/spin_kernel.cu LIBS cutrain_model)
# `cutrain train --timing_report --profile_steps` end to end (CPU always; CUDA skipped without a device).
if(TARGET cutrain)
  cutrain_add_cli_test(profile_cli profile_cli.sh)
endif()
