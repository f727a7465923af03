# Checkpoint files through the aio handle vs plain I/O (byte-identical files, bit-identical resume)
# and the aio file layer under them: CPU tests.
cutrain_add_test(NAME test_checkpoint_io LABEL cpu SOURCES unit/test_checkpoint_io.cpp LIBS cutrain_model)
