# Tests of the model library: parameter table, CPU reference model, precision layouts, the GPU
# model against the reference, and the `cutrain train` program end to end.
cutrain_add_test(NAME test_transformer_params LABEL cpu SOURCES unit/test_transformer_params.cpp LIBS cutrain_model)
cutrain_add_test(NAME test_reference_model LABEL cpu SOURCES unit/test_reference_model.cpp LIBS cutrain_model)
cutrain_add_test(NAME test_precision LABEL cpu SOURCES unit/test_precision.cpp LIBS cutrain_model)
cutrain_add_test(NAME test_train_loop LABEL cpu SOURCES unit/test_train_loop.cpp LIBS cutrain_model)
