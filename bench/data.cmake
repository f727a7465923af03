# CPU benchmark of the GPT-2 tokenizer (no GPU needed).
add_executable(bench_tokenizer ${CMAKE_CURRENT_LIST_DIR}/bench_tokenizer.cpp)
target_link_libraries(bench_tokenizer PRIVATE cutrain_data benchmark::benchmark)
target_compile_definitions(bench_tokenizer PRIVATE CUTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
