# `cutrain check-config`: validate a config and show what it resolves to.
target_sources(cutrain PRIVATE ${CMAKE_CURRENT_LIST_DIR}/check_config_command.cpp)
target_link_libraries(cutrain PRIVATE cutrain_model)
