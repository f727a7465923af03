#include "data/encode_documents.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>

namespace cutrain::data {

std::vector<int32_t> encode_documents(const Gpt2Tokenizer& tok, const std::vector<std::string_view>& docs,
                                      const EncodeOptions& options) {
  const int32_t eot = tok.eot_id();
  std::size_t total = 0;
  for (auto d : docs) total += d.size();

  // Chunks of consecutive documents of about 1 MiB: big enough to amortize, small enough to balance.
  std::vector<std::size_t> chunk_begin{0};
  for (std::size_t i = 0, bytes = 0; i < docs.size(); ++i) {
    bytes += docs[i].size();
    if (bytes >= (1u << 20) && i + 1 < docs.size()) {
      chunk_begin.push_back(i + 1);
      bytes = 0;
    }
  }
  chunk_begin.push_back(docs.size());
  const std::size_t n_chunks = chunk_begin.size() - 1;
  std::vector<std::vector<int32_t>> out(n_chunks);

  int threads = options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::max(1, std::min<int>(threads, static_cast<int>(n_chunks)));
  std::atomic<std::size_t> next_chunk{0}, done_bytes{0};
  std::atomic<int> finished{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    WordCache cache;
    try {
      for (std::size_t c; (c = next_chunk.fetch_add(1)) < n_chunks;) {
        std::size_t bytes = 0;
        for (std::size_t i = chunk_begin[c]; i < chunk_begin[c + 1]; ++i) {
          out[c].push_back(eot);
          tok.encode(docs[i], out[c], &cache);
          bytes += docs[i].size();
        }
        done_bytes += bytes;
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next_chunk = n_chunks;
    }
    ++finished;
  };
  std::vector<std::thread> pool;
  if (options.progress && threads > 1) {
    // All threads encode; the calling thread only reports progress.
    for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
    while (finished.load() < threads) {
      options.progress(done_bytes.load(), total);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } else {
    for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
  }
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  if (options.progress) options.progress(total, total);

  std::size_t n = 0;
  for (auto& v : out) n += v.size();
  std::vector<int32_t> all;
  all.reserve(n);
  for (auto& v : out) all.insert(all.end(), v.begin(), v.end());
  return all;
}

}  // namespace cutrain::data
