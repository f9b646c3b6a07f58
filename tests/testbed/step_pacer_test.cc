// The emulator's step pacing (testbed/step_pacer.h): late wake-ups are made
// up out of the following steps' sleeps while the engine stays busy, and
// forgiven when it goes idle.
#include "testbed/step_pacer.h"

#include <gtest/gtest.h>

#include <chrono>

namespace tandem::testbed {
namespace {

using std::chrono::microseconds;

TEST(StepPacer, OnTimeStepsSleepTheirModelledTime) {
  StepPacer p;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(p.start(microseconds(700)), microseconds(700));
    p.woke(microseconds(0));
  }
  EXPECT_EQ(p.late(), microseconds(0));
  EXPECT_EQ(p.unrecovered(), microseconds(0));
}

TEST(StepPacer, LatenessIsMadeUpByTheNextStepsWhileBusy) {
  StepPacer p;
  microseconds slept{0};
  auto step = [&](microseconds late) {
    const auto sleep = p.start(microseconds(1000));
    slept += std::chrono::duration_cast<microseconds>(sleep);
    p.woke(late);
    return sleep;
  };
  EXPECT_EQ(step(microseconds(2500)), microseconds(1000));  // woke 2.5 ms after the step's end
  // The next steps sleep less until the 2.5 ms are made up, never below 0.
  EXPECT_EQ(step(microseconds(0)), microseconds(0));
  EXPECT_EQ(step(microseconds(100)), microseconds(0));  // late again: 0.6 ms still owed
  EXPECT_EQ(step(microseconds(0)), microseconds(400));
  EXPECT_EQ(step(microseconds(0)), microseconds(1000));
  EXPECT_EQ(p.late(), microseconds(2600));
  EXPECT_EQ(p.unrecovered(), microseconds(0));
  // Over the busy stretch the wall time, sleeps plus lateness, is the
  // model's: five steps of 1 ms.
  EXPECT_EQ(slept + p.late(), microseconds(5000));
}

TEST(StepPacer, AnIdleEngineForgivesWhatItOwed) {
  StepPacer p;
  p.start(microseconds(1000));
  p.woke(microseconds(300));
  EXPECT_EQ(p.unrecovered(), microseconds(300));  // owed, not made up yet
  p.idle();
  EXPECT_EQ(p.unrecovered(), microseconds(300));  // forgiven: it delayed the model
  EXPECT_EQ(p.start(microseconds(1000)), microseconds(1000));
  p.woke(microseconds(0));
  p.idle();
  EXPECT_EQ(p.late(), microseconds(300));
  EXPECT_EQ(p.unrecovered(), microseconds(300));
}

TEST(StepPacer, AnEarlyWakeOrAZeroStepOwesNothing) {
  StepPacer p;
  p.woke(microseconds(-50));
  EXPECT_EQ(p.late(), microseconds(0));
  p.woke(microseconds(200));
  EXPECT_EQ(p.start(microseconds(0)), microseconds(0));  // nothing to pay from
  EXPECT_EQ(p.start(microseconds(150)), microseconds(0));
  EXPECT_EQ(p.start(microseconds(150)), microseconds(100));
  EXPECT_EQ(p.unrecovered(), microseconds(0));
}

}  // namespace
}  // namespace tandem::testbed
