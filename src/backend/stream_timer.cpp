#include "backend/stream_timer.h"

#include <chrono>
#include <utility>

namespace amsp::backend {

namespace {

class HostTimer final : public StreamTimer {
 public:
  void start() override { t0_ = Clock::now(); }
  void stop(int slot) override {
    done_.push_back({slot, std::chrono::duration<double, std::milli>(Clock::now() - t0_).count()});
  }
  std::vector<Stretch> take() override { return std::exchange(done_, {}); }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0_;
  std::vector<Stretch> done_;
};

}  // namespace

std::unique_ptr<StreamTimer> make_host_timer() { return std::make_unique<HostTimer>(); }

}  // namespace amsp::backend
