cutrain_add_test(NAME test_aio LABEL cpu SOURCES unit/test_aio.cpp)
cutrain_add_test(NAME test_aio_gpu LABEL gpu SOURCES gpu/test_aio_gpu.cpp)
