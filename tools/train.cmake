# `cutrain train`: the training binary's main job.
target_sources(cutrain PRIVATE ${CMAKE_CURRENT_LIST_DIR}/train_command.cpp)
target_link_libraries(cutrain PRIVATE cutrain_model)
# The no-argument run finds configs/ from any working directory.
target_compile_definitions(cutrain PRIVATE CUTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
