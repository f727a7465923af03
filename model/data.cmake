# cutrain_data: the GPT-2 tokenizer, token shards and the data loader. CPU only; depends on the
# runtime alone so the model library (and tests) can link it without the transformer.
add_library(cutrain_data STATIC
  ${CMAKE_CURRENT_LIST_DIR}/data/utf8.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data/pretokenize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data/byte_unicode.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data/gpt2_tokenizer_load.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data/gpt2_tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data/encode_documents.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data/documents.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data/token_shard.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data/batch_sampler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data/data_loader.cpp
)
target_link_libraries(cutrain_data PUBLIC cutrain_runtime nlohmann_json::nlohmann_json Threads::Threads)
