# `cutrain prepare-data`: the tokenizer and shard writer of model/data.
target_sources(cutrain PRIVATE ${CMAKE_CURRENT_LIST_DIR}/prepare_data_command.cpp)
target_link_libraries(cutrain PRIVATE cutrain_data)
