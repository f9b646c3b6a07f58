// JobInbox: the rounds from the HTTP front to an engine thread, as the
// emulator and tandem-llama use it.
#include "testbed/job_inbox.h"

#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <thread>

namespace tandem::testbed {
namespace {

std::shared_ptr<Job> job(std::string session) {
  CompletionRequest r;
  r.session_name = std::move(session);
  return std::make_shared<Job>(std::move(r), "id", 0);
}

Time later(std::chrono::seconds s) { return base::MonotonicClock().now() + s; }

TEST(JobInbox, ANamedSessionHasOneRoundInFlightUntilItIsOver) {
  JobInbox inbox;
  EXPECT_EQ(inbox.submit(job("a")), SubmitStatus::kQueued);
  EXPECT_EQ(inbox.submit(job("a")), SubmitStatus::kBusy);
  EXPECT_EQ(inbox.submit(job("b")), SubmitStatus::kQueued);
  EXPECT_EQ(inbox.submit(job("")), SubmitStatus::kQueued);
  EXPECT_EQ(inbox.submit(job("")), SubmitStatus::kQueued) << "anonymous rounds are never busy";

  std::deque<std::shared_ptr<Job>> out;
  EXPECT_FALSE(inbox.take(out).has_value());
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0]->request().session_name, "a");
  EXPECT_EQ(out[1]->request().session_name, "b");
  EXPECT_EQ(inbox.submit(job("a")), SubmitStatus::kBusy) << "taken is still in flight";
  inbox.round_over("a");
  EXPECT_EQ(inbox.submit(job("a")), SubmitStatus::kQueued);
  // take() appends after what the caller still holds.
  inbox.take(out);
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out.back()->request().session_name, "a");
}

TEST(JobInbox, DrainRefusesNewRoundsAndKeepsTheEarliestDeadline) {
  JobInbox inbox;
  ASSERT_EQ(inbox.submit(job("a")), SubmitStatus::kQueued);
  const Time first = later(std::chrono::seconds(10));
  inbox.drain(first);
  inbox.drain(first + std::chrono::seconds(5));
  EXPECT_EQ(inbox.submit(job("b")), SubmitStatus::kDraining);
  std::deque<std::shared_ptr<Job>> out;
  EXPECT_EQ(inbox.take(out), first);
  EXPECT_EQ(out.size(), 1u) << "what was queued before the drain is still handed over";
  inbox.drain(first - std::chrono::seconds(5));
  EXPECT_EQ(inbox.take(out), first - std::chrono::seconds(5));
}

TEST(JobInbox, FailQueuedAnswersEveryQueuedRoundAndFreesItsSession) {
  JobInbox inbox;
  auto a = job("a");
  auto anon = job("");
  ASSERT_EQ(inbox.submit(a), SubmitStatus::kQueued);
  ASSERT_EQ(inbox.submit(anon), SubmitStatus::kQueued);
  EXPECT_EQ(inbox.fail_queued(503, "shutting down"), 2u);
  for (const auto& j : {a, anon}) {
    const Job::Progress p = j->wait(0, later(std::chrono::seconds(0)));
    EXPECT_EQ(p.status, 503);
    EXPECT_EQ(p.error, "shutting down");
  }
  EXPECT_EQ(inbox.submit(job("a")), SubmitStatus::kQueued);
  std::deque<std::shared_ptr<Job>> out;
  inbox.take(out);
  EXPECT_EQ(out.size(), 1u);
  EXPECT_EQ(inbox.fail_queued(503, "x"), 0u);
}

// The engine thread sleeps in wait() and must wake for a round or a drain,
// not sleep out its wake time (an hour here: a missed wake-up hangs the test).
TEST(JobInbox, WaitWakesForARoundAndForADrain) {
  JobInbox inbox;
  std::deque<std::shared_ptr<Job>> out;
  const auto seen = inbox.take(out);
  std::thread submitter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    inbox.submit(job("a"));
  });
  inbox.wait(later(std::chrono::seconds(3600)), seen);
  submitter.join();
  EXPECT_FALSE(inbox.take(out).has_value());
  EXPECT_EQ(out.size(), 1u);

  const auto before = inbox.take(out);
  std::thread drainer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    inbox.drain(later(std::chrono::seconds(1)));
  });
  inbox.wait(later(std::chrono::seconds(3600)), before);
  drainer.join();
  EXPECT_TRUE(inbox.take(out).has_value());
  // A deadline other than the one seen: no sleep at all.
  inbox.wait(later(std::chrono::seconds(3600)), before);
}

TEST(JobInbox, StatsAreWhatWasLastPublished) {
  JobInbox inbox;
  EXPECT_EQ(inbox.stats(), "");
  inbox.publish(R"({"a":1})");
  inbox.publish(R"({"a":2})");
  EXPECT_EQ(inbox.stats(), R"({"a":2})");
}

}  // namespace
}  // namespace tandem::testbed
