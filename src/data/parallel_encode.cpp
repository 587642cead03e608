#include "data/parallel_encode.h"

#include <sched.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

namespace amsp::data {
namespace {

// A batch is this much text, or this many documents, whichever comes first:
// large enough that handing it over costs nothing beside encoding it.
constexpr size_t kBatchBytes = 256 * 1024;
constexpr size_t kBatchDocuments = 4096;
constexpr size_t kBatchesPerThread = 4;

struct Batch {
  std::vector<std::string> docs;
  std::vector<int32_t> ids;
  bool done = false;
  std::exception_ptr error;
};

// Batches in document order: the reader appends, workers claim the oldest
// unclaimed one, the sink takes finished ones from the front. A deque keeps
// every batch in place while others come and go.
class Pipeline {
 public:
  Pipeline(const Tokenizer& tokenizer, int threads) : tokenizer_(tokenizer), capacity_(threads * kBatchesPerThread) {
    for (int t = 0; t < threads; ++t) workers_.emplace_back([this] { work(); });
  }
  ~Pipeline() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
    }
    claimable_.notify_all();
    for (auto& w : workers_) w.join();
  }

  // Queues a batch, first handing finished ones to sink while the queue is full.
  void submit(std::vector<std::string> docs, const std::function<void(const std::vector<int32_t>&)>& sink) {
    while (true) {
      drain(sink, /*wait=*/false);
      std::unique_lock<std::mutex> lock(mu_);
      if (batches_.size() < capacity_) break;
      finished_.wait(lock, [&] { return batches_.front().done; });
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      batches_.push_back(Batch{std::move(docs), {}, false, nullptr});
    }
    claimable_.notify_one();
  }

  // Hands finished batches at the front to sink; with wait, every batch.
  void drain(const std::function<void(const std::vector<int32_t>&)>& sink, bool wait) {
    while (true) {
      std::unique_lock<std::mutex> lock(mu_);
      if (batches_.empty()) return;
      if (wait) finished_.wait(lock, [&] { return batches_.front().done; });
      if (!batches_.front().done) return;
      Batch b = std::move(batches_.front());
      batches_.pop_front();
      --claimed_;
      lock.unlock();
      if (b.error) std::rethrow_exception(b.error);
      sink(b.ids);
    }
  }

 private:
  void work() {
    while (true) {
      Batch* b = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        claimable_.wait(lock, [&] { return closing_ || claimed_ < batches_.size(); });
        if (closing_) return;  // done, or given up after an error: what is left is dropped
        b = &batches_[claimed_++];
      }
      try {
        for (const std::string& d : b->docs) tokenizer_.encode_document(d, &b->ids);
      } catch (...) {
        b->error = std::current_exception();
      }
      b->docs = {};
      {
        std::lock_guard<std::mutex> lock(mu_);
        b->done = true;
      }
      finished_.notify_all();
    }
  }

  const Tokenizer& tokenizer_;
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable claimable_, finished_;
  std::deque<Batch> batches_;
  size_t claimed_ = 0;  // batches_[0, claimed_) are claimed by a worker or done
  bool closing_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

void encode_in_order(const std::function<bool(std::string*)>& next, const Tokenizer& tokenizer, int threads,
                     const std::function<void(const std::vector<int32_t>&)>& sink) {
  Pipeline pipeline(tokenizer, std::max(threads, 1));
  std::vector<std::string> docs;
  size_t bytes = 0;
  std::string text;
  while (next(&text)) {
    bytes += text.size();
    docs.push_back(std::move(text));
    text = {};
    if (bytes >= kBatchBytes || docs.size() >= kBatchDocuments) {
      pipeline.submit(std::move(docs), sink);
      docs = {};
      bytes = 0;
    }
  }
  if (!docs.empty()) pipeline.submit(std::move(docs), sink);
  pipeline.drain(sink, /*wait=*/true);
}

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace amsp::data
