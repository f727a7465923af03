# Profiling support: the timing report's math and formatting, --profile_steps (CPU); named-region
# event timing of known kernels and the measured peaks (GPU).
cutrain_add_test(NAME test_timing LABEL cpu SOURCES unit/test_timing.cpp)
cutrain_add_test(NAME test_timing_gpu LABEL gpu SOURCES gpu/test_timing_gpu.cpp gpu/spin_kernel.cu)
