# Config loader, file helpers, LR schedules and safetensors: all CPU tests.
cutrain_add_test(NAME test_config LABEL cpu SOURCES unit/test_config.cpp)
target_compile_definitions(test_config PRIVATE CUTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
cutrain_add_test(NAME test_file_util LABEL cpu SOURCES unit/test_file_util.cpp)
# model/ sources compiled in directly: these CPU tests then build without the CUDA kernels that
# cutrain_model pulls in.
cutrain_add_test(NAME test_lr_schedule LABEL cpu SOURCES unit/test_lr_schedule.cpp ${PROJECT_SOURCE_DIR}/model/lr_schedule.cpp)
cutrain_add_test(NAME test_safetensors LABEL cpu SOURCES unit/test_safetensors.cpp ${PROJECT_SOURCE_DIR}/model/safetensors.cpp)
