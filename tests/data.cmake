# Tests of cutrain_data: tokenizer, shards, loader (CPU), and `cutrain prepare-data` end to end.
# Tests that need ../shared/data (GPT-2 files, WikiText-2) skip with a message when it is absent.
foreach(t test_tokenizer test_shards test_data_loader)
  cutrain_add_test(NAME ${t} LABEL cpu SOURCES unit/${t}.cpp LIBS cutrain_data)
  target_compile_definitions(${t} PRIVATE CUTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
endforeach()
cutrain_add_test(NAME test_prepare_data_e2e LABEL cpu SOURCES e2e/test_prepare_data_e2e.cpp LIBS cutrain_data)
target_compile_definitions(test_prepare_data_e2e PRIVATE CUTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                           CUTRAIN_BIN="$<TARGET_FILE:cutrain>")
add_dependencies(test_prepare_data_e2e cutrain)
# `cutrain train --use_real_data --eval_data` end to end (next-token + causal default, validation
# loss, --pad_vocab, --labels identity, input errors); skipped without ../shared/data.
cutrain_add_cli_test(real_data_cli real_data_cli.sh)
