# Config loader, file helpers, LR schedules and safetensors: all CPU tests.
cutrain_add_test(NAME test_config LABEL cpu SOURCES unit/test_config.cpp)
target_compile_definitions(test_config PRIVATE CUTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
cutrain_add_test(NAME test_file_util LABEL cpu SOURCES unit/test_file_util.cpp)
# model/ sources compiled in directly: these CPU tests then build without the CUDA kernels that
# cutrain_model pulls in.
cutrain_add_test(NAME test_lr_schedule LABEL cpu SOURCES unit/test_lr_schedule.cpp ${PROJECT_SOURCE_DIR}/model/lr_schedule.cpp)
cutrain_add_test(NAME test_safetensors LABEL cpu SOURCES unit/test_safetensors.cpp ${PROJECT_SOURCE_DIR}/model/safetensors.cpp)

# End to end through the `cutrain` binary: the shipped configs pass strict, a missing one fails.
if(TARGET cutrain)
  foreach(cfg baseline bf16_master_wg bf16_full offload_cpu offload_nvme bf16_full_nvme_optimizer)
    add_test(NAME e2e.check_config.${cfg} COMMAND cutrain check-config configs/${cfg}.json --strict --world-size 4
             WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(e2e.check_config.${cfg} PROPERTIES LABELS cpu
                         PASS_REGULAR_EXPRESSION "OK \\(0 warnings\\).*train 16 = micro 4 x accumulation 1 x world 4")
  endforeach()
  add_test(NAME e2e.check_config.missing_file COMMAND cutrain check-config configs/no_such_config.json
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(e2e.check_config.missing_file PROPERTIES LABELS cpu WILL_FAIL TRUE)
endif()
