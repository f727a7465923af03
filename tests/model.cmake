# Tests of the model library: parameter table, CPU reference model, precision layouts, the GPU
# model against the reference, and the `cutrain train` program end to end.
cutrain_add_test(NAME test_transformer_params LABEL cpu SOURCES unit/test_transformer_params.cpp LIBS cutrain_model)
cutrain_add_test(NAME test_reference_model LABEL cpu SOURCES unit/test_reference_model.cpp LIBS cutrain_model)
cutrain_add_test(NAME test_precision LABEL cpu SOURCES unit/test_precision.cpp LIBS cutrain_model)
cutrain_add_test(NAME test_train_loop LABEL cpu SOURCES unit/test_train_loop.cpp LIBS cutrain_model)
cutrain_add_test(NAME test_model_gpu LABEL gpu SOURCES gpu/test_model_gpu.cpp LIBS cutrain_model)
# The `cutrain train` binary end to end (CPU always; CUDA skipped without a device).
cutrain_add_cli_test(train_cli train_cli.sh)
