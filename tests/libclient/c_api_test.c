/* tandem.h compiles as C11 and libtandem works from C: an engine and a
 * runner against a runtime dir without a daemon run fail-open. Returns
 * nonzero (and says why) on the first failed check. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "tandem/tandem.h"

static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int main(void) {
  tandem_options opts;
  memset(&opts, 0, sizeof opts);
  opts.sz = sizeof opts;
  opts.runtime_dir = "/nonexistent/tandem-c-api-test";
  opts.name = "c-api-test";
  opts.fallback_cap = 2;

  tandem_engine_params params;
  memset(&params, 0, sizeof params);
  params.sz = sizeof params;
  params.gpu_index = -1;
  params.block_size = 16;
  params.total_blocks = 1024;
  params.max_seqs = 8;
  params.token_budget = 512;

  tandem_client* engine = NULL;
  CHECK(tandem_engine_open(&opts, &params, &engine) == 0);
  if (engine == NULL) return 1;
  CHECK(tandem_connected(engine) == 0);
  CHECK(tandem_client_id(engine) == 0);
  CHECK(strcmp(tandem_engine_policy(engine), "fcfs") == 0);

  /* Three queued rounds, two local slots: the first two run. */
  uint64_t s[3] = {tandem_session_id("c-a"), tandem_session_id("c-b"), tandem_session_id("c-c")};
  tandem_round round;
  memset(&round, 0, sizeof round);
  round.sz = sizeof round;
  round.prompt_tokens = 100;
  for (int i = 0; i < 3; ++i) CHECK(tandem_round_submit(engine, s[i], &round) == 0);
  CHECK(tandem_session_runnable(engine, s[0]) == 1);
  CHECK(tandem_session_runnable(engine, s[1]) == 1);
  CHECK(tandem_session_runnable(engine, s[2]) == 0);
  CHECK(tandem_round_end(engine, s[0], 0, 10, 0, 0) == 0);
  CHECK(tandem_session_runnable(engine, s[2]) == 1);

  /* Validation and roles, with a message. */
  CHECK(tandem_round_submit(engine, 0, &round) == -EINVAL);
  CHECK(strstr(tandem_last_error(engine), "session") != NULL);
  CHECK(tandem_session_open(engine, "x", NULL, &s[0]) == -EPERM);

  double t0 = now_ms();
  tandem_directive d[4];
  CHECK(tandem_poll(engine, 30, 4, d) == 0);
  double waited = now_ms() - t0;
  CHECK(waited >= 25.0 && waited < 1000.0);

  tandem_client_stats stats;
  memset(&stats, 0, sizeof stats);
  stats.sz = sizeof stats;
  CHECK(tandem_get_stats(engine, &stats) == 0);
  CHECK(stats.connects == 0 && stats.records_sent == 0 && stats.records_dropped == 4);
  tandem_close(engine);

  tandem_client* runner = NULL;
  CHECK(tandem_runner_open(&opts, &runner) == 0);
  if (runner == NULL) return 1;
  uint64_t session = 0;
  CHECK(tandem_session_open(runner, "c-runner-session", NULL, &session) == 0);
  CHECK(session == tandem_session_id("c-runner-session"));
  CHECK(tandem_tool_begin(runner, session, "pytest", 1, 0) == 0);
  CHECK(tandem_tool_end(runner, session, "pytest", 1, 0, NULL) == 0);
  CHECK(tandem_session_close(runner, session, TANDEM_CLOSE_NORMAL) == 0);
  CHECK(tandem_round_submit(runner, session, &round) == -EPERM);
  tandem_close(runner);
  tandem_close(NULL);

  if (failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  puts("c_api_test: ok");
  return 0;
}
