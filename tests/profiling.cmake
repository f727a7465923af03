# The training loop's profiling glue (model/step_profiler): FLOP count and step logic on the CPU,
# the timed window with its report on the GPU.
cutrain_add_test(NAME test_step_profiler LABEL cpu SOURCES unit/test_step_profiler.cpp LIBS cutrain_model)
cutrain_add_test(NAME test_step_profiler_gpu LABEL gpu SOURCES gpu/test_step_profiler_gpu.cpp gpu/spin_kernel.cu
                 LIBS cutrain_model)
# `cutrain train --timing_report --profile_steps` end to end (CPU always; CUDA skipped without a device).
if(TARGET cutrain)
  foreach(dev cpu cuda)
    add_test(NAME e2e_profile_cli_${dev}
             COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/e2e/profile_cli.sh $<TARGET_FILE:cutrain> ${dev}
             WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(e2e_profile_cli_${dev} PROPERTIES SKIP_RETURN_CODE 77 LABELS $<IF:$<STREQUAL:${dev},cpu>,cpu,gpu>)
  endforeach()
endif()
