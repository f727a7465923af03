# StateOffloader: CPU bookkeeping and errors; GPU round trips, memory movement, ordering.
cutrain_add_test(NAME test_offload LABEL cpu SOURCES unit/test_offload.cpp)
cutrain_add_test(NAME test_offload_gpu LABEL gpu SOURCES gpu/test_offload_gpu.cpp LIBS cutrain_offload_model)
# `cutrain offload-bench` and scripts/offload-sweep.sh end to end (cpu: error paths; cuda: the
# output lines, the log, the table; skipped without a device).
foreach(mode cpu cuda)
  add_test(NAME e2e_offload_cli_${mode} COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/e2e/offload_cli.sh $<TARGET_FILE:cutrain> ${mode}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  if(mode STREQUAL "cpu")
    set(label cpu)
  else()
    set(label gpu)
  endif()
  set_tests_properties(e2e_offload_cli_${mode} PROPERTIES SKIP_RETURN_CODE 77 LABELS ${label})
endforeach()
# GpuEngine::offload_states / reload_states (training continues bit-exactly, every layout).
cutrain_add_test(NAME test_offload_engine_gpu LABEL gpu SOURCES gpu/test_offload_engine_gpu.cpp LIBS cutrain_model)
