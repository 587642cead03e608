#include "backend/stream_timer.h"

#include <chrono>
#include <utility>

namespace amsp::backend {

namespace {

class HostTimer final : public StreamTimer {
 public:
  void start() override { t0_ = Clock::now(); }
  void stop(int slot) override {
    const Clock::time_point t1 = Clock::now();
    done_.push_back({slot, ms(t0_, t1), chained_ ? ms(last_stop_, t0_) : -1});
    last_stop_ = t1;
    chained_ = true;
  }
  std::vector<Stretch> take() override {
    chained_ = false;
    return std::exchange(done_, {});
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double ms(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  }
  Clock::time_point t0_, last_stop_;
  bool chained_ = false;  // a stretch was stopped since the last take
  std::vector<Stretch> done_;
};

}  // namespace

std::unique_ptr<StreamTimer> make_host_timer() { return std::make_unique<HostTimer>(); }

}  // namespace amsp::backend
