cutrain_add_test(NAME test_comm LABEL cpu SOURCES unit/test_comm.cpp)
