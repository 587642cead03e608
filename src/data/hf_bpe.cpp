#include "data/hf_bpe.h"

#include <atomic>
#include <cstdio>
#include <queue>

#include "core/error.h"
#include "data/unicode.h"

namespace amsp::data {
namespace {

std::atomic<uint64_t> next_cache_key{1};

// Words of this length or longer are not cached (tokenizers' own limit is 256 bytes).
constexpr size_t kMaxCachedWord = 256;
constexpr size_t kCacheCapacity = 1 << 16;

struct Cache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
};

Cache& cache_for(uint64_t key) {
  thread_local Cache cache;
  if (cache.owner != key) {
    cache.words.clear();
    cache.owner = key;
  }
  return cache;
}

}  // namespace

BpeModel::BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options, const std::string& what)
    : vocab_(std::move(vocab)), options_(options), cache_key_(next_cache_key++) {
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    const auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
      fail_usage(what, ": merge #", r, " (\"", a, "\" \"", b, "\") names a token not in the vocabulary");
    // A repeated pair keeps its last rank, as tokenizers' map does.
    merges_[pair_key(ia->second, ib->second)] = Merge{static_cast<uint32_t>(r), iab->second};
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto it = vocab_.find(std::string_view(name));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

// tokenizers' BPE::merge_word before the merges: each character's id; an
// unknown one as its bytes (byte fallback, when every byte has a token) or the
// unknown id, fused with the unknown before it when fuse_unk.
void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>* ids) const {
  int32_t pending_unk = -1;
  for (size_t i = 0; i < word.size();) {
    size_t len = 1;
    decode_utf8(word.data() + i, word.size() - i, &len);
    const std::string_view ch = word.substr(i, len);
    i += len;
    if (const auto it = vocab_.find(ch); it != vocab_.end()) {
      if (pending_unk >= 0) ids->push_back(pending_unk), pending_unk = -1;
      ids->push_back(it->second);
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_ids_[b] >= 0;
      if (all) {
        // As tokenizers does: the bytes go in before an unknown still pending.
        for (unsigned char b : ch) ids->push_back(byte_ids_[b]);
        continue;
      }
    }
    if (options_.unk_id < 0) continue;
    if (pending_unk >= 0 && !options_.fuse_unk) ids->push_back(pending_unk);
    pending_unk = options_.unk_id;
  }
  if (pending_unk >= 0) ids->push_back(pending_unk);
}

// tokenizers' Word::merge_all: a queue of (rank, position), lowest first;
// entries made stale by an earlier merge are skipped.
void BpeModel::merge_all(std::vector<int32_t>* ids) const {
  std::vector<int32_t>& sym = *ids;
  const int n = static_cast<int>(sym.size());
  if (n < 2) return;
  std::vector<int> prev(n), next(n);
  std::vector<char> alive(n, 1);
  for (int i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  using Entry = std::pair<uint64_t, int32_t>;  // (rank << 32 | position, new id)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue;
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    const auto it = merges_.find(pair_key(sym[pos], sym[next[pos]]));
    if (it != merges_.end())
      queue.push({(static_cast<uint64_t>(it->second.rank) << 32) | static_cast<uint32_t>(pos), it->second.id});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const auto [key, new_id] = queue.top();
    queue.pop();
    const int pos = static_cast<int>(key & 0xFFFFFFFFu);
    if (!alive[pos] || next[pos] < 0) continue;
    const auto it = merges_.find(pair_key(sym[pos], sym[next[pos]]));
    if (it == merges_.end() || it->second.id != new_id) continue;
    const int right = next[pos];
    sym[pos] = new_id;
    alive[right] = 0;
    next[pos] = next[right];
    if (next[pos] >= 0) prev[next[pos]] = pos;
    push(prev[pos]);
    push(pos);
  }
  int k = 0;
  for (int i = 0; i < n; ++i)
    if (alive[i]) sym[k++] = sym[i];
  sym.resize(k);
}

void BpeModel::encode(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const auto it = vocab_.find(word); it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  Cache& cache = cache_for(cache_key_);
  if (const auto it = cache.words.find(word); it != cache.words.end()) {
    out->insert(out->end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<int32_t> ids;
  initial_symbols(word, &ids);
  merge_all(&ids);
  out->insert(out->end(), ids.begin(), ids.end());
  if (word.size() < kMaxCachedWord) {
    if (cache.words.size() >= kCacheCapacity) cache.words.clear();
    cache.words.emplace(std::string(word), std::move(ids));
  }
}

}  // namespace amsp::data
