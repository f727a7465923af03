// Encoding (pre-tokenize, then BPE per piece through the cache) and decoding.
#include "data/gpt2_tokenizer.h"

#include <algorithm>
#include <queue>

#include "data/pretokenize.h"
#include "runtime/error.h"

namespace cutrain::data {

const std::vector<int32_t>* WordCache::find(std::string_view piece) const {
  const auto it = map_.find(piece);
  return it == map_.end() ? nullptr : &it->second;
}

void WordCache::insert(std::string_view piece, std::vector<int32_t> ids) {
  if (map_.size() >= max_entries_) map_.clear();  // crude but bounded; hot words come back quickly
  map_.emplace(std::string(piece), std::move(ids));
}

int32_t Gpt2Tokenizer::eot_id() const {
  CUTRAIN_CHECK(eot_ >= 0, "the vocabulary has no '<|endoftext|>' token");
  return eot_;
}

const Gpt2Tokenizer::Merge* Gpt2Tokenizer::find_merge(int32_t a, int32_t b) const {
  const auto it = merges_.find(pair_key(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

// GPT-2's bpe(): repeatedly take the lowest-ranked adjacent pair and merge ALL its occurrences left
// to right, then look again. Done with a heap so long pieces (runs of digits or spaces) stay
// O(n log n): every occurrence of the current rank is popped as one batch before any pair formed by
// those merges is considered (a new pair can rank lower and must wait, as in GPT-2's loop).
void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const int n = static_cast<int>(piece.size());
  if (n == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  std::vector<int32_t> id(n), next(n), prev(n);
  for (int i = 0; i < n; ++i) {
    id[i] = byte_id_[static_cast<unsigned char>(piece[i])];
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  struct Cand {
    int32_t rank, pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  auto push_pair = [&](int p) {
    if (p < 0 || next[p] < 0) return;
    if (const Merge* m = find_merge(id[p], id[next[p]])) heap.push({m->rank, p, id[p], id[next[p]]});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  std::vector<Cand> batch;
  std::vector<int> touched;
  while (!heap.empty()) {
    const int32_t rank = heap.top().rank;
    batch.clear();
    while (!heap.empty() && heap.top().rank == rank) {
      batch.push_back(heap.top());
      heap.pop();
    }
    touched.clear();
    for (const Cand& c : batch) {  // ascending pos: left to right
      const int p = c.pos;
      if (id[p] != c.left || next[p] < 0 || id[next[p]] != c.right) continue;  // stale
      const int q = next[p];
      id[p] = find_merge(c.left, c.right)->merged;
      id[q] = -1;
      next[p] = next[q];
      if (next[q] >= 0) prev[next[q]] = p;
      touched.push_back(p);
    }
    for (int p : touched) {
      if (id[p] < 0) continue;
      push_pair(prev[p]);
      push_pair(p);
    }
  }
  for (int p = 0; p >= 0; p = next[p]) out.push_back(id[p]);
}

void Gpt2Tokenizer::encode(std::string_view text, std::vector<int32_t>& out, WordCache* cache) const {
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t len = next_piece(text, pos);
    const std::string_view piece = text.substr(pos, len);
    pos += len;
    if (len == 1) {
      out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
      continue;
    }
    // Long pieces are rare and would only churn the cache.
    if (cache && len <= 64) {
      if (const std::vector<int32_t>* hit = cache->find(piece)) {
        out.insert(out.end(), hit->begin(), hit->end());
        continue;
      }
      const std::size_t start = out.size();
      encode_piece(piece, out);
      cache->insert(piece, std::vector<int32_t>(out.begin() + start, out.end()));
    } else {
      encode_piece(piece, out);
    }
  }
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  WordCache cache;
  encode(text, out, &cache);
  return out;
}

const std::string& Gpt2Tokenizer::token_bytes(int32_t id) const {
  CUTRAIN_CHECK(id >= 0 && id < vocab_size(), "token id ", id, " is outside the vocabulary (0..",
                vocab_size() - 1, ")");
  return token_bytes_[id];
}

std::string Gpt2Tokenizer::decode(const int32_t* ids, std::size_t n) const {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out += token_bytes(ids[i]);
  return out;
}

}  // namespace cutrain::data
