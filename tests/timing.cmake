# Profiling support: the timing report's math and formatting, --profile_steps (CPU); named-region
# event timing of known kernels and the measured peaks (GPU).
cutrain_add_test(NAME test_timing LABEL cpu SOURCES unit/test_timing.cpp)
# SERIAL: region times of spin kernels (2 ms +- 0.2) and the measured peaks; with other test
# processes on the GPU the 2 ms spin's region read 2.21 ms (H200, session 5).
cutrain_add_test(NAME test_timing_gpu LABEL gpu SERIAL SOURCES gpu/test_timing_gpu.cpp gpu/spin_kernel.cu)
# The benchmark-suite tools (scripts/bench-all.sh, bench/merge_runs.py, bench/compare_runs.py) on
# synthetic inputs: plain python3 + bash, no pip.
find_program(CUTRAIN_PYTHON3 python3)
if(CUTRAIN_PYTHON3)
  add_test(NAME bench_tools_py COMMAND ${CUTRAIN_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_bench_tools.py
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(bench_tools_py PROPERTIES LABELS cpu TIMEOUT 120)
endif()
