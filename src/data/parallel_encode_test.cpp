// Documents come back in input order whatever order the threads finish in.
#include "data/parallel_encode.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>

#include "core/error.h"

namespace amsp::data {
namespace {

// Document "i" encodes as the id i; the first document takes long, so that
// the batches after the first finish before it.
class SlowFirst final : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override { return {std::stoi(text)}; }
  void encode_document(const std::string& text, std::vector<int32_t>* out) const override {
    if (text == "0") std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (text == "fail") throw UsageError("document refused");
    out->push_back(std::stoi(text));
  }
  std::string decode(const std::vector<int32_t>&) const override { return {}; }
  int64_t vocab_size() const override { return 1 << 30; }
  int32_t eos_id() const override { return -1; }
  int32_t bos_id() const override { return -1; }
  std::string kind() const override { return "test"; }
};

std::function<bool(std::string*)> numbers(int n, int fail_at = -1) {
  auto i = std::make_shared<int>(0);
  return [=](std::string* text) {
    if (*i == n) return false;
    *text = *i == fail_at ? "fail" : std::to_string(*i);
    ++*i;
    return true;
  };
}

TEST(ParallelEncode, DocumentsComeBackInOrderWhenLaterBatchesFinishFirst) {
  const int n = 50000;  // a dozen batches
  for (int threads : {1, 2, 5}) {
    std::vector<int32_t> ids;
    encode_in_order(numbers(n), SlowFirst(), threads,
                    [&](const std::vector<int32_t>& b) { ids.insert(ids.end(), b.begin(), b.end()); });
    ASSERT_EQ(ids.size(), static_cast<size_t>(n)) << threads << " threads";
    for (int i = 0; i < n; ++i) ASSERT_EQ(ids[i], i) << threads << " threads";
  }
}

TEST(ParallelEncode, ATokenizerErrorReachesTheCaller) {
  EXPECT_THROW(encode_in_order(numbers(20000, 12345), SlowFirst(), 3, [](const std::vector<int32_t>&) {}),
               UsageError);
}

}  // namespace
}  // namespace amsp::data
