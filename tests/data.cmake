# Tests of cutrain_data: tokenizer, shards, loader (CPU), and `cutrain prepare-data` end to end.
# Tests that need ../shared/data (GPT-2 files, WikiText-2) skip with a message when it is absent.
foreach(t test_tokenizer)
  cutrain_add_test(NAME ${t} LABEL cpu SOURCES unit/${t}.cpp LIBS cutrain_data)
  target_compile_definitions(${t} PRIVATE CUTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
endforeach()
