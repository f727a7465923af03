target_sources(cutrain PRIVATE ${CMAKE_CURRENT_LIST_DIR}/launch_command.cpp ${CMAKE_CURRENT_LIST_DIR}/comm_check_command.cpp)
