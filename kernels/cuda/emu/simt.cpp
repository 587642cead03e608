// The SIMT emulation's scheduler: a block's threads as Boost.Context fibers,
// resumed round-robin in linear thread order by the launching OS thread. A
// fiber gives control back only at a barrier or when it finishes, so between
// barriers each thread runs straight through, and the interleaving (hence every
// result) is the same on every run.
#include "kernels/cuda/emu/simt.h"

#include <algorithm>
#include <atomic>
#include <boost/context/fiber.hpp>
#include <boost/context/protected_fixedsize_stack.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace amsp::emu::simt {

namespace bc = boost::context;

namespace {

// Kernels keep little on the stack; a guard page below each stack turns an
// overflow into a crash rather than a silent corruption of the next one.
constexpr size_t kStackBytes = 128 * 1024;

// Stacks are kept for the next block instead of being mapped and unmapped per
// emulated thread: a launch of a million threads maps at most a block's worth.
class StackPool {
 public:
  ~StackPool() {
    for (bc::stack_context& s : free_) make_.deallocate(s);
  }
  bc::stack_context get() {
    if (free_.empty()) return make_.allocate();
    const bc::stack_context s = free_.back();
    free_.pop_back();
    return s;
  }
  void put(bc::stack_context s) noexcept {
    if (free_.size() < free_.capacity()) {
      free_.push_back(s);
    } else {
      make_.deallocate(s);
    }
  }
  void reserve(size_t n) {
    if (free_.capacity() < n) free_.reserve(n);
  }

 private:
  bc::protected_fixedsize_stack make_{kStackBytes};
  std::vector<bc::stack_context> free_;
};

thread_local StackPool stack_pool;

struct PooledStack {
  bc::stack_context allocate() { return stack_pool.get(); }
  void deallocate(bc::stack_context& s) noexcept { stack_pool.put(s); }
};

enum class Wait { kNone, kBlock, kWarp };

// One 16-byte cp.async in flight: the bytes it read, and where they land.
struct AsyncCopy {
  void* dst;
  unsigned char bytes[16];
};

struct Thread {
  ThreadInfo info{};
  std::vector<AsyncCopy> copies;  // issued, not yet landed, oldest first
  std::vector<size_t> groups;     // where each committed group ends in `copies`
  int linear = 0;
  bc::fiber fiber;  // the suspended thread; empty while it runs and once it finished
  bc::fiber back;   // the scheduler, while this thread runs
  bool done = false;
  Wait wait = Wait::kNone;
  const uint64_t* generation = nullptr;  // runnable again once *generation != seen
  uint64_t seen = 0;
};

struct Warp {
  unsigned exists = 0;    // lanes the block has
  unsigned arrived = 0;   // lanes waiting at the current rendezvous
  unsigned expected = 0;  // the mask of the current rendezvous
  uint64_t generation = 0;
  uint64_t slots[32] = {};
  uint32_t fragments[32][6] = {};  // mma_bf16_16x8x16: each lane's a[4] and b[2]
  const uint16_t* rows[32] = {};   // ldmatrix: the row each lane names
};

struct Block {
  const char* kernel = nullptr;
  KernelBody body = nullptr;
  const void* context = nullptr;
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  int arrived = 0;  // threads waiting at __syncthreads
  uint64_t generation = 0;
  Thread* running = nullptr;
  std::exception_ptr error;
};

thread_local Block* active = nullptr;
thread_local int64_t switches = 0;
thread_local int64_t fibers_started = 0;

std::string where(const Block& b) {
  const dim3 i = b.threads.front().info.block_idx;
  return std::string("kernel ") + b.kernel + ", block (" + std::to_string(i.x) + "," +
         std::to_string(i.y) + "," + std::to_string(i.z) + ")";
}

[[noreturn]] void fail_in_thread(const std::string& what) {
  const Block& b = *active;
  const dim3 t = b.running->info.thread_idx;
  throw std::runtime_error("SIMT emulation: " + where(b) + ", thread (" + std::to_string(t.x) +
                           "," + std::to_string(t.y) + "," + std::to_string(t.z) + "): " + what);
}

// Gives control back to the scheduler until the rendezvous at `generation` completes.
void wait_for(Wait kind, const uint64_t* generation) {
  Thread& t = *active->running;
  t.wait = kind;
  t.generation = generation;
  t.seen = *generation;
  t.back = std::move(t.back).resume();
}

bc::fiber thread_main(Thread& t, bc::fiber&& scheduler) {
  t.back = std::move(scheduler);
  try {
    active->body(active->context);
  } catch (const bc::detail::forced_unwind&) {
    throw;  // a failed launch unwinding this fiber: Boost.Context's own exception
  } catch (...) {
    active->error = std::current_exception();
  }
  return std::move(t.back);
}

void start_threads(Block& b, const ThreadInfo& shape) {
  const dim3 bd = shape.block_dim;
  stack_pool.reserve(b.threads.size());
  for (Thread& t : b.threads) {
    const unsigned l = static_cast<unsigned>(t.linear);
    t.info = shape;
    t.info.thread_idx = dim3(l % bd.x, l / bd.x % bd.y, l / (bd.x * bd.y));
    t.done = false;
    t.wait = Wait::kNone;
    t.generation = nullptr;
    t.copies.clear();  // a block that exited with copies in flight: they land nowhere
    t.groups.clear();
    t.fiber = bc::fiber(std::allocator_arg, PooledStack{},
                        [&t](bc::fiber&& s) { return thread_main(t, std::move(s)); });
    ++fibers_started;
  }
}

[[noreturn]] void fail_divergence(const Block& b) {
  int at_block = 0, at_warp = 0, finished = 0;
  for (const Thread& t : b.threads) {
    finished += t.done;
    at_block += !t.done && t.wait == Wait::kBlock;
    at_warp += !t.done && t.wait == Wait::kWarp;
  }
  throw std::runtime_error("SIMT emulation: " + where(b) + ": barrier divergence, no thread can run: " +
                           std::to_string(at_block) + " wait at __syncthreads, " +
                           std::to_string(at_warp) + " at a warp op, " + std::to_string(finished) +
                           " finished, of " + std::to_string(b.threads.size()));
}

Order order_from_environment() {
  const char* e = std::getenv("AMSP_SIMT_ORDER");
  if (e == nullptr || std::strcmp(e, "forward") == 0) return Order::kForward;
  if (std::strcmp(e, "reverse") == 0) return Order::kReverse;
  if (std::strcmp(e, "lowest-first") == 0) return Order::kLowestFirst;
  throw std::runtime_error(std::string("SIMT emulation: AMSP_SIMT_ORDER is \"") + e +
                           "\"; expected forward, reverse or lowest-first");
}

thread_local Order schedule_order = order_from_environment();

// Round-robin over the threads until all finished (lowest-first: the scan
// starts again from thread 0 after every resume). A full pass without a
// runnable thread is a deadlock.
void schedule(Block& b) {
  const size_t n = b.threads.size();
  const bool reverse = schedule_order == Order::kReverse;
  const bool restart = schedule_order == Order::kLowestFirst;
  size_t live = n, idle = 0;
  for (size_t k = 0; live > 0; k = k + 1 == n ? 0 : k + 1) {
    const size_t i = reverse ? n - 1 - k : k;
    Thread& t = b.threads[i];
    if (t.done || (t.generation != nullptr && *t.generation == t.seen)) {
      if (++idle > n) fail_divergence(b);
      continue;
    }
    idle = 0;
    t.generation = nullptr;
    t.wait = Wait::kNone;
    b.running = &t;
    current = &t.info;
    t.fiber = std::move(t.fiber).resume();
    ++switches;
    if (b.error) std::rethrow_exception(b.error);
    if (!t.fiber) {
      t.done = true;
      --live;
    }
    if (restart) k = n - 1;  // the loop's step wraps it to 0
  }
}

// Each function's opt-in to more dynamic shared memory than kMaxDynamicShared.
struct SharedOptins {
  std::mutex mu;
  std::map<const void*, size_t> bytes;
};
SharedOptins& shared_optins() {
  static SharedOptins o;
  return o;
}

size_t max_dynamic_shared(const void* function) {
  SharedOptins& o = shared_optins();
  std::lock_guard lock(o.mu);
  const auto it = o.bytes.find(function);
  // Never past what the device allows now (a test may play a smaller GPU after
  // a kernel opted in on the default one).
  return it == o.bytes.end()
             ? kMaxDynamicShared
             : std::max(kMaxDynamicShared, std::min(it->second, device_shared_optin()));
}

void check_config(const char* kernel, const void* function, dim3 grid, dim3 block,
                  size_t shared_bytes) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  std::string bad;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535)
    bad = "grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," +
          std::to_string(grid.z) + ") is empty or beyond CUDA's limits";
  else if (threads == 0 || threads > kMaxBlockThreads || block.z > 64)
    bad = "block (" + std::to_string(block.x) + "," + std::to_string(block.y) + "," +
          std::to_string(block.z) + ") has no threads or more than CUDA allows";
  else if (shared_bytes > max_dynamic_shared(function))
    bad = std::to_string(shared_bytes) + " bytes of dynamic shared memory, more than " +
          std::to_string(max_dynamic_shared(function)) +
          (shared_bytes <= device_shared_optin()
               ? " (cudaFuncSetAttribute's cudaFuncAttributeMaxDynamicSharedMemorySize allows more)"
               : "");
  if (!bad.empty())
    throw std::runtime_error(std::string("SIMT emulation: kernel ") + kernel + ": " + bad);
}

void init_block(Block& b, int threads) {
  b.threads.resize(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) b.threads[static_cast<size_t>(i)].linear = i;
  b.warps.assign(static_cast<size_t>((threads + 31) / 32), Warp{});
  for (size_t w = 0; w < b.warps.size(); ++w) {
    const int lanes = std::min(32, threads - static_cast<int>(w) * 32);
    b.warps[w].exists = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
  }
}

// Clears the state of a launch however it ends (a failed launch unwinds the
// fibers still suspended when `b` goes).
struct ActiveGuard {
  explicit ActiveGuard(Block* b) { active = b; }
  ~ActiveGuard() {
    active = nullptr;
    current = nullptr;
  }
};

}  // namespace

namespace {
std::atomic<size_t> g_device_shared_optin{kMaxDynamicSharedOptin};
}  // namespace

size_t device_shared_optin() { return g_device_shared_optin.load(); }

void set_device_shared_optin(size_t bytes) {
  g_device_shared_optin = bytes == 0 ? kMaxDynamicSharedOptin : std::max(bytes, kMaxDynamicShared);
}

bool set_max_dynamic_shared(const void* function, size_t bytes) {
  if (bytes > device_shared_optin()) return false;
  SharedOptins& o = shared_optins();
  std::lock_guard lock(o.mu);
  o.bytes[function] = bytes;
  return true;
}

namespace {
std::atomic<uint64_t> blocks{0};
}  // namespace

uint64_t blocks_launched() { return blocks.load(std::memory_order_relaxed); }

void run(const char* kernel, const void* function, dim3 grid, dim3 block, size_t shared_bytes,
         KernelBody body, const void* context) {
  if (active != nullptr)
    throw std::runtime_error(std::string("SIMT emulation: kernel ") + kernel +
                             " launched from inside kernel " + active->kernel);
  check_config(kernel, function, grid, block, shared_bytes);
  amsp::emu::count_launch();
  blocks.fetch_add(uint64_t{grid.x} * grid.y * grid.z, std::memory_order_relaxed);
  if (amsp::emu::dry_run()) return;
  std::vector<std::max_align_t> shared((shared_bytes + sizeof(std::max_align_t) - 1) /
                                       sizeof(std::max_align_t));
  Block b;
  b.kernel = kernel;
  b.body = body;
  b.context = context;
  init_block(b, static_cast<int>(block.x * block.y * block.z));
  ActiveGuard guard(&b);
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        std::memset(shared.data(), 0xff, shared.size() * sizeof(std::max_align_t));
        b.arrived = 0;
        for (Warp& w : b.warps) w.arrived = 0;
        start_threads(b, ThreadInfo{dim3(), dim3(x, y, z), block, grid, shared.data()});
        schedule(b);
      }
}

void sync_block() {
  Block& b = *active;
  if (++b.arrived == static_cast<int>(b.threads.size())) {
    b.arrived = 0;
    ++b.generation;
    return;
  }
  wait_for(Wait::kBlock, &b.generation);
}

void sync_warp(unsigned mask) {
  Block& b = *active;
  const int linear = b.running->linear;
  Warp& w = b.warps[static_cast<size_t>(linear / 32)];
  const unsigned me = 1u << (linear % 32);
  if ((mask & ~w.exists) != 0)
    fail_in_thread("warp op mask " + std::to_string(mask) + " names lanes this block does not have");
  if ((mask & me) == 0) fail_in_thread("warp op mask " + std::to_string(mask) + " leaves out the caller");
  if (w.arrived == 0) {
    w.expected = mask;
  } else if (mask != w.expected) {
    fail_in_thread("lanes of one warp meet with different masks (" + std::to_string(mask) +
                   " and " + std::to_string(w.expected) + ")");
  }
  w.arrived |= me;
  if (w.arrived == w.expected) {
    w.arrived = 0;
    ++w.generation;
    return;
  }
  wait_for(Wait::kWarp, &w.generation);
}

uint64_t exchange(unsigned mask, uint64_t value, int src) {
  Block& b = *active;
  const int linear = b.running->linear;
  Warp& w = b.warps[static_cast<size_t>(linear / 32)];
  w.slots[linear % 32] = value;
  sync_warp(mask);
  if (src < 0 || src > 31 || ((mask >> src) & 1u) == 0)
    fail_in_thread("shuffle reads lane " + std::to_string(src) + ", outside its mask " +
                   std::to_string(mask));
  const uint64_t got = w.slots[src];
  sync_warp(mask);
  return got;
}

void ldmatrix(uint32_t* words, int count, bool trans, const uint16_t* row) {
  Block& blk = *active;
  const int linear = blk.running->linear, lane = linear % 32;
  Warp& w = blk.warps[static_cast<size_t>(linear / 32)];
  if (lane < 8 * count && reinterpret_cast<uintptr_t>(row) % 16 != 0)
    fail_in_thread("ldmatrix row address not 16-byte aligned");
  w.rows[lane] = row;
  sync_warp(0xffffffffu);  // ldmatrix.sync is for the whole warp
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < count; ++i) {
    const uint16_t* lo = trans ? w.rows[8 * i + 2 * t] + g : w.rows[8 * i + g] + 2 * t;
    const uint16_t* hi = trans ? w.rows[8 * i + 2 * t + 1] + g : lo + 1;
    words[i] = static_cast<uint32_t>(*lo) | (static_cast<uint32_t>(*hi) << 16);
  }
  sync_warp(0xffffffffu);  // no lane names its next row before all have read
}

void cp_async16(void* dst, const void* src, bool fill_zero) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0)
    fail_in_thread("cp.async address not 16-byte aligned");
  AsyncCopy c{dst, {}};
  if (!fill_zero) std::memcpy(c.bytes, src, sizeof c.bytes);
  if (order() == Order::kLowestFirst) {
    std::memcpy(dst, c.bytes, sizeof c.bytes);  // the earliest a copy may land
    return;
  }
  active->running->copies.push_back(c);
}

void check_aligned(const void* p, size_t bytes) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0)
    fail_in_thread("misaligned address: a " + std::to_string(bytes) +
                   "-byte access at an address " +
                   std::to_string(reinterpret_cast<uintptr_t>(p) % bytes) +
                   " bytes past a multiple of " + std::to_string(bytes));
}

void cp_async_commit() {
  Thread& t = *active->running;
  t.groups.push_back(t.copies.size());
}

void cp_async_wait(int pending) {
  Thread& t = *active->running;
  if (pending < 0 || t.groups.size() <= static_cast<size_t>(pending)) return;
  const size_t landed = t.groups[t.groups.size() - 1 - static_cast<size_t>(pending)];
  for (size_t i = 0; i < landed; ++i) std::memcpy(t.copies[i].dst, t.copies[i].bytes, 16);
  t.copies.erase(t.copies.begin(), t.copies.begin() + static_cast<std::ptrdiff_t>(landed));
  t.groups.erase(t.groups.begin(), t.groups.end() - pending);
  for (size_t& end : t.groups) end -= landed;
}

// PTX's fragments of mma.m16n8k16 with .bf16 inputs: lane = 4 g + t; a[r]
// holds A (16 x 16, row-major) at row g + 8 (r % 2), columns 8 (r / 2) + 2 t
// and + 1 (low half first); b[r] holds B (16 x 8) at rows 8 r + 2 t and + 1,
// column g; d[i] is D at row g + 8 (i / 2), column 2 t + i % 2.
void mma_bf16_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  Block& blk = *active;
  const int linear = blk.running->linear, lane = linear % 32;
  Warp& w = blk.warps[static_cast<size_t>(linear / 32)];
  for (int r = 0; r < 4; ++r) w.fragments[lane][r] = a[r];
  for (int r = 0; r < 2; ++r) w.fragments[lane][4 + r] = b[r];
  sync_warp(0xffffffffu);  // mma.sync is for the whole warp
  auto half = [](uint32_t word, int hi) {
    const uint32_t bits = (hi ? word >> 16 : word & 0xffffu) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return static_cast<double>(f);
  };
  auto a_at = [&](int row, int col) {  // the lane holding (row, col) and where
    const int t = (col % 8) / 2, g = row % 8, r = (row / 8) + 2 * (col / 8);
    return half(w.fragments[4 * g + t][r], col % 2);
  };
  auto b_at = [&](int row, int col) {
    const int t = (row % 8) / 2, r = row / 8;
    return half(w.fragments[4 * col + t][4 + r], row % 2);
  };
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    double sum = 0;
    for (int k = 0; k < 16; ++k) sum += a_at(row, k) * b_at(k, col);
    d[i] = static_cast<float>(static_cast<double>(d[i]) + sum);
  }
  sync_warp(0xffffffffu);  // no lane deposits its next fragments before all have read
}

float ex2_approx(float x) {
  const float y = std::exp2(x);
  if (std::isnan(y) || std::isinf(y)) return y;
  if (y < std::numeric_limits<float>::min()) return 0.0f;  // .ftz
  uint32_t xb, yb;
  std::memcpy(&xb, &x, sizeof xb);
  std::memcpy(&yb, &y, sizeof yb);
  const int ulps = static_cast<int>((xb * 2654435761u) >> 29) % 5 - 2;  // -2..2, from x alone
  const uint32_t moved = yb + static_cast<uint32_t>(ulps);
  if ((moved & 0x7f800000u) == 0x7f800000u || (moved & 0x7f800000u) == 0) return y;
  float out;
  std::memcpy(&out, &moved, sizeof out);
  return out;
}

void set_order(Order o) { schedule_order = o; }
Order order() { return schedule_order; }

int64_t switch_count() { return switches; }
int64_t fiber_count() { return fibers_started; }

}  // namespace amsp::emu::simt

// Out of line on purpose (simt.h): a call is never contracted with its caller's arithmetic.
float __fmul_rn(float a, float b) { return a * b; }
float __fadd_rn(float a, float b) { return a + b; }
