// Two-process tests over a real shared memfd: a producer process and a
// consumer process pinned to different CPUs.
//
//   - 10^8 records carrying a sequence number and a checksum, with a
//     busy-polling consumer and again with a consumer that sleeps on the
//     doorbell between bursts: no loss, no reordering, no duplicates.
//   - A hostile producer that scribbles random bytes over the whole segment
//     (header, indices, slots) while the daemon-side consumer and directive
//     producer keep working: no crash, no out-of-bounds access (the ASan build
//     checks that), corruption counted and reported.
//
// TANDEM_STRESS_RECORDS overrides the record count (default 10^8).
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ipc/channel.h"

namespace tandem::ipc {
namespace {

using namespace std::chrono_literals;

std::uint64_t record_count() {
  const char* env = std::getenv("TANDEM_STRESS_RECORDS");
  return env != nullptr ? std::strtoull(env, nullptr, 10) : 100'000'000ull;
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

Slot make_record(std::uint64_t seq) {
  Slot s;
  s.words[0] = seq;
  std::uint64_t sum = seq;
  for (int i = 1; i < 7; ++i) {
    s.words[i] = mix(seq * 7 + static_cast<std::uint64_t>(i));
    sum = mix(sum ^ s.words[i]);
  }
  s.words[7] = sum;
  return s;
}

bool record_ok(const Slot& s) {
  std::uint64_t sum = s.words[0];
  for (int i = 1; i < 7; ++i) {
    if (s.words[i] != mix(s.words[0] * 7 + static_cast<std::uint64_t>(i))) return false;
    sum = mix(sum ^ s.words[i]);
  }
  return s.words[7] == sum;
}

// The first two CPUs we may run on, or -1 when there is only one.
std::pair<int, int> two_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int first = -1;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (!CPU_ISSET(c, &set)) continue;
      if (first < 0) {
        first = c;
      } else {
        return {first, c};
      }
    }
  }
  return {-1, -1};
}

// Restores the test process's CPU affinity when it goes out of scope, so
// pinning in one test does not leave the next with a single CPU.
class AffinityGuard {
 public:
  AffinityGuard() { ::sched_getaffinity(0, sizeof saved_, &saved_); }
  ~AffinityGuard() { ::sched_setaffinity(0, sizeof saved_, &saved_); }
  AffinityGuard(const AffinityGuard&) = delete;
  AffinityGuard& operator=(const AffinityGuard&) = delete;

 private:
  cpu_set_t saved_;
};

void pin_to(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ::sched_setaffinity(0, sizeof set, &set);
}

// A forked child that runs `body` and _exit()s with its return value. The
// destructor kills and reaps it, so a failing assertion leaves no process.
class Child {
 public:
  explicit Child(const std::function<int()>& body) {
    pid_ = ::fork();
    if (pid_ == 0) ::_exit(body());
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0; }
  // The child's exit status, or -1 if it died of a signal.
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
};

struct Outcome {
  std::uint64_t received = 0;
  std::uint64_t bad = 0;  // checksum failures, gaps, duplicates, reorders
  std::uint64_t sleeps = 0;
};

// Producer side, in the child: `n` records in batches of varying size. With
// `bursty`, it pauses between bursts so the consumer goes to sleep.
int produce(Channel& ch, std::uint64_t n, bool bursty, int cpu) {
  pin_to(cpu);
  auto ring = ch.event_producer();
  if (!ring) return 10;
  Doorbell bell = ch.event_doorbell();
  std::mt19937_64 rng(42);
  std::vector<Slot> batch(64);
  std::uint64_t seq = 0;
  std::uint64_t burst_left = 0;
  while (seq < n) {
    if (bursty && burst_left == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(20 + rng() % 100));
      burst_left = 1 + rng() % 8192;
    }
    std::size_t want = 1 + rng() % batch.size();
    if (want > n - seq) want = static_cast<std::size_t>(n - seq);
    if (bursty && want > burst_left) want = static_cast<std::size_t>(burst_left);
    for (std::size_t i = 0; i < want; ++i) batch[i] = make_record(seq + i);
    std::size_t pushed = ring->push_batch(std::span(batch).first(want));
    if (pushed > 0) bell.notify();
    seq += pushed;
    if (bursty) burst_left -= pushed;
  }
  return 0;
}

// Consumer side, in the test process.
Outcome consume(Channel& ch, std::uint64_t n, bool sleepy, int cpu) {
  pin_to(cpu);
  Outcome out;
  auto ring = ch.event_consumer();
  EXPECT_TRUE(ring);
  if (!ring) return out;
  Doorbell bell = ch.event_doorbell();
  std::vector<Slot> batch(256);
  std::uint64_t expected = 0;
  while (expected < n) {
    std::size_t got = ring->pop_batch(batch);
    if (got == 0) {
      if (!sleepy) continue;
      auto ready = bell.wait([&] { return !ring->empty(); }, 20s, 512);
      if (!ready || !*ready) {
        ADD_FAILURE() << "consumer starved after " << expected << " records";
        break;
      }
      continue;
    }
    for (std::size_t i = 0; i < got; ++i) {
      if (batch[i].words[0] != expected || !record_ok(batch[i])) ++out.bad;
      expected = batch[i].words[0] + 1;
    }
    out.received += got;
  }
  out.sleeps = bell.sleeps();
  EXPECT_TRUE(ring->empty()) << "records beyond the last one";
  EXPECT_EQ(ring->corruption_count(), 0u);
  return out;
}

void run_transfer(bool sleepy) {
  const std::uint64_t n = record_count();
  auto ch = Channel::create(ChannelConfig{4096, 64});
  ASSERT_TRUE(ch) << ch.error().message();
  AffinityGuard restore_affinity;
  auto [producer_cpu, consumer_cpu] = two_cpus();
  auto start = std::chrono::steady_clock::now();
  Child child([&] { return produce(*ch, n, sleepy, producer_cpu); });
  ASSERT_TRUE(child.started());
  Outcome out = consume(*ch, n, sleepy, consumer_cpu);
  EXPECT_EQ(child.wait(), 0);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(out.received, n);
  EXPECT_EQ(out.bad, 0u);
  if (sleepy) {
    EXPECT_GT(out.sleeps, 0u) << "the doorbell path was never exercised";
  }
  fmt::print("  {} records in {:.2f} s ({:.1f} M/s), consumer slept {} times\n", out.received, secs,
             static_cast<double>(out.received) / secs / 1e6, out.sleeps);
}

TEST(TwoProcess, BusyConsumerLosesNothing) { run_transfer(false); }

TEST(TwoProcess, SleepingConsumerLosesNothing) { run_transfer(true); }

// The hostile client, in two modes it alternates between: random words over
// every byte of the segment (header, indices, slots), and protocol-aware
// forgery — garbage records behind valid turns and a matching tail, placed
// right after the head the consumer published, so they reach its decoder. It also tries to shrink the memfd, which the
// seals refuse.
int scribble(Channel& ch, std::uint32_t event_slots, std::chrono::milliseconds duration) {
  std::span<std::byte> bytes = ch.segment().bytes();
  if (::ftruncate(ch.segment_fd(), 0) == 0) return 20;  // seals must stop this
  auto* words = reinterpret_cast<volatile std::uint64_t*>(bytes.data());
  const std::size_t nwords = bytes.size() / 8;
  const Region* ring = ch.segment().layout().find(RegionKind::kEventRing);
  auto* control = reinterpret_cast<volatile RingControl*>(bytes.data() + ring->offset);
  auto* slots = reinterpret_cast<volatile Slot*>(bytes.data() + ring->offset + sizeof(RingControl));
  const unsigned shift = static_cast<unsigned>(std::countr_zero(event_slots));
  const std::size_t head_word = (ring->offset + offsetof(RingControl, head)) / 8;
  std::mt19937_64 rng(7);
  auto end = std::chrono::steady_clock::now() + duration;
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 4096; ++i) {
      std::uint64_t r = rng();
      // The one word the forger reads (the event ring's head) is spared.
      if (r % nwords == head_word) continue;
      // Mostly small numbers and plausible record types, sometimes anything.
      words[r % nwords] = (r >> 60) < 4 ? r : (r >> 32) % 64;
    }
    // Forge just ahead of where the consumer says it is.
    const std::uint32_t head = control->head;
    for (std::uint32_t index = head; index != head + 64; ++index) {
      volatile Slot& slot = slots[index & (event_slots - 1)];
      for (int w = 1; w < 8; ++w) slot.words[w] = rng() % 4 == 0 ? rng() : rng() % 64;
      std::uint64_t turn = (index >> shift) + 1;
      slot.words[0] = (rng() % 48) | (std::uint64_t{rng() % 3} << 16) | (turn << 32);
      control->tail = index + 1;
    }
  }
  return 0;
}

TEST(TwoProcess, HostileProducerCannotHurtTheDaemonSide) {
  auto ch = Channel::create(ChannelConfig{256, 256});
  ASSERT_TRUE(ch) << ch.error().message();
  auto events = ch->event_consumer();
  auto directives = ch->directive_producer();
  ASSERT_TRUE(events && directives);
  Doorbell directive_bell = ch->directive_doorbell();
  const auto duration = 2s;

  Child child([&] { return scribble(*ch, 256, duration); });
  ASSERT_TRUE(child.started());
  RecordDecoder decoder(Direction::kToDaemon);
  std::vector<Slot> batch(64);
  Record rec;
  std::uint64_t popped = 0;
  Admit admit;
  admit.header.session = 1;
  auto end = std::chrono::steady_clock::now() + duration;
  while (std::chrono::steady_clock::now() < end) {
    std::size_t got = events->pop_batch(batch);
    popped += got;
    for (std::size_t i = 0; i < got; ++i) (void)decoder.decode(batch[i], rec);
    if (directives->try_push(encode(admit))) directive_bell.notify();
    (void)ch->segment().take_flags(kFlagResyncNeeded);
  }
  EXPECT_EQ(child.wait(), 0) << "child exit 20 means the sealed memfd could be shrunk";
  const std::uint64_t rejected =
      decoder.unknown_type + decoder.wrong_direction + decoder.bad_version + decoder.bad_field;
  fmt::print(
      "  popped {} garbage slots: {} rejected, {} accepted; ring corruption seen {} (consumer) {} (producer) times\n",
      popped, rejected, decoder.ok, events->corruption_count(), directives->corruption_count());
  EXPECT_GT(popped, 0u);
  EXPECT_GT(rejected, 0u);
  EXPECT_GT(events->corruption_count(), 0u) << "impossible tails must be counted";
  EXPECT_GT(directives->corruption_count(), 0u) << "impossible heads must be counted";
  // The daemon side is still usable: a fresh, well-behaved channel works.
  auto again = Channel::create(ChannelConfig{64, 64});
  ASSERT_TRUE(again);
}

}  // namespace
}  // namespace tandem::ipc
