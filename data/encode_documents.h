// @brief Encodes many documents on several threads into one token stream, "<|endoftext|>" before
// each document (llm.c's convention, so streams and shards concatenate cleanly).
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "data/gpt2_tokenizer.h"

namespace cutrain::data {

struct EncodeOptions {
  int threads = 0;  // 0: std::thread::hardware_concurrency()
  // Called now and then from the calling thread with the bytes encoded so far (progress bars).
  std::function<void(std::size_t done_bytes, std::size_t total_bytes)> progress;
};

// Per document: [eot] + encode(doc). The result does not depend on the thread count.
std::vector<int32_t> encode_documents(const Gpt2Tokenizer& tok, const std::vector<std::string_view>& docs,
                                      const EncodeOptions& options = {});

}  // namespace cutrain::data
