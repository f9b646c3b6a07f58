"""The ctypes binding of libtandem (libclient/python/tandem).

- Layout: every ctypes Structure has the size, field names, offsets and
  field sizes the C compiler gives the tandem.h struct (printed by the
  tandem_abi_layout helper, $TANDEM_ABI_HELPER).
- Ids: session_id()/tool_kind() equal xxh64 as base::session_id computes it,
  and a known xxh64 test vector.
- Fail-open: against an empty runtime dir (no daemon) every call succeeds,
  submitted rounds are runnable up to fallback_cap and not beyond, a slot
  comes back at the round's end, poll() returns [] after its timeout.
- Errors: bad arguments raise TandemError (an OSError) with EINVAL, wrong
  roles EPERM, with the library's message.
- Tool processes: without a daemon, Runner.tool_spawn() still runs the tool
  (unplaced: cgroup_id 0, counted in stats) with its argv, env, cwd and
  stdio; tool_wait() reports exit codes, timeouts (TimeoutError) and kills
  (SIGNALED); bad arguments raise with the library's codes.

Run by ctest (tests/python/CMakeLists.txt), which sets TANDEM_LIBRARY,
TANDEM_ABI_HELPER and PYTHONPATH.
"""

import ctypes
import errno
import os
import signal
import subprocess
import tempfile
import time
import unittest

import tandem
from tandem import _ffi


def abi_facts():
    """(sizes, fields, ids, enums) from the C helper."""
    helper = os.environ.get("TANDEM_ABI_HELPER")
    if not helper:
        raise unittest.SkipTest("TANDEM_ABI_HELPER is not set (run through ctest)")
    # Under TANDEM_SANITIZE, ctest preloads the shared sanitizer runtime for
    # python3; the helper carries its own (static) copy and must not get both.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run([helper], check=True, capture_output=True, text=True, env=env).stdout
    sizes, fields, ids, enums = {}, {}, {}, {}
    for line in out.splitlines():
        kind, *rest = line.split()
        if kind == "size":
            sizes[rest[0]] = int(rest[1])
        elif kind == "field":
            fields.setdefault(rest[0], []).append((rest[1], int(rest[2]), int(rest[3])))
        elif kind == "session_id":
            ids[rest[0]] = int(rest[1], 16)
        elif kind == "enum":
            enums[rest[0]] = int(rest[1])
    return sizes, fields, ids, enums


ENGINE = dict(block_size=16, total_blocks=1000, max_seqs=64, token_budget=2048)


class LayoutTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sizes, cls.fields, cls.ids, cls.enums = abi_facts()

    def test_every_struct_is_checked(self):
        self.assertEqual(set(self.sizes), set(_ffi.STRUCTS))

    def test_sizes_match_c(self):
        for cname, struct in _ffi.STRUCTS.items():
            with self.subTest(struct=cname):
                self.assertEqual(ctypes.sizeof(struct), self.sizes[cname])

    def test_fields_match_c(self):
        for cname, struct in _ffi.STRUCTS.items():
            with self.subTest(struct=cname):
                mine = [(name, getattr(struct, name).offset, getattr(struct, name).size) for name, _ in struct._fields_]
                self.assertEqual(mine, self.fields[cname])

    def test_sz_is_set_to_the_struct_size(self):
        for cname, struct in _ffi.STRUCTS.items():
            if struct._fields_[0][0] != "sz":
                continue
            with self.subTest(struct=cname):
                self.assertEqual(struct().sz, self.sizes[cname])

    def test_tool_structs_are_checked(self):
        # The structs of the tool-process API, and the stats grown for it.
        for cname in ("tandem_tool_options", "tandem_tool_result"):
            self.assertIn(cname, _ffi.STRUCTS)
            self.assertIn(cname, self.sizes)
        self.assertEqual(ctypes.sizeof(_ffi.ToolOptions), self.sizes["tandem_tool_options"])
        self.assertEqual(ctypes.sizeof(_ffi.ToolResultC), self.sizes["tandem_tool_result"])
        stats = [name for name, _, _ in self.fields["tandem_client_stats"]]
        self.assertEqual(stats[-2:], ["tools_spawned", "tools_unplaced"])

    def test_tool_exit_reasons_match_c(self):
        self.assertEqual(
            {f"TANDEM_TOOL_{r.name}": r.value for r in tandem.ToolExitReason},
            {k: v for k, v in self.enums.items() if k.startswith("TANDEM_TOOL_")},
        )


class IdTest(unittest.TestCase):
    def test_known_xxh64_vector(self):
        # XXH64("abc", seed 0) from the xxHash reference implementation.
        self.assertEqual(tandem.session_id("abc"), 0x44BC2CF5AD770999)
        self.assertEqual(tandem.session_id(b"abc"), 0x44BC2CF5AD770999)
        self.assertEqual(tandem.tool_kind("abc"), 0x44BC2CF5AD770999)

    def test_ids_match_base_session_id(self):
        _, _, ids, _ = abi_facts()
        self.assertTrue(ids)
        for name, expected in ids.items():
            with self.subTest(name=name):
                self.assertEqual(tandem.session_id(name), expected)
                self.assertEqual(tandem.tool_kind(name), expected)

    def test_names_with_nul_are_rejected(self):
        with self.assertRaises(tandem.TandemError) as cm:
            tandem.session_id("a\0b")
        self.assertEqual(cm.exception.errno, errno.EINVAL)


class FailOpenTest(unittest.TestCase):
    """No daemon: the runtime dir is empty."""

    def setUp(self):
        self._dir = tempfile.TemporaryDirectory(prefix="tandem-py-")
        self.dir = self._dir.name

    def tearDown(self):
        self._dir.cleanup()

    def engine(self, **kw):
        args = dict(ENGINE, runtime_dir=self.dir, name="py-engine")
        args.update(kw)
        return tandem.Engine(**args)

    def test_engine_calls_succeed_and_cap_holds(self):
        with self.engine(fallback_cap=2) as eng:
            self.assertFalse(eng.connected())
            self.assertEqual(eng.client_id(), 0)
            s1, s2, s3 = (tandem.session_id(f"s{i}") for i in (1, 2, 3))
            # Sessions this handle never submitted are runnable.
            self.assertTrue(eng.session_runnable(s1))
            eng.round_submit(s1, 0, prompt_tokens=100)
            eng.round_submit(s2, 0, prompt_tokens=100, cached_tokens=50, projected_blocks=10, max_output_tokens=64)
            eng.round_submit("s3", 0, prompt_tokens=100)  # a name works as well as an id
            # Slots go in submit order: s3 is beyond the cap of 2.
            self.assertFalse(eng.session_runnable(s3))
            self.assertTrue(eng.session_runnable(s1))
            self.assertTrue(eng.session_runnable(s2))
            self.assertFalse(eng.session_runnable(s3))
            # The end of s1's round hands its slot to s3.
            eng.round_first_token(s1, 0, queue_delay_ns=1000, prefill_ns=2000)
            eng.round_end(s1, 0, output_tokens=20, blocks_held=8, tool_follows=True)
            self.assertTrue(eng.session_runnable(s3))
            self.assertEqual(eng.session_priority(s1), 0)
            eng.kv_stats(blocks_total=1000, blocks_free=900, running_seqs=2, waiting_seqs=1, step_tokens=300)
            eng.kv_event(s1, tandem.KvEventKind.EVICTED, blocks=8, round=0)
            eng.session_name(s2, "s2")
            stats = eng.stats()
            self.assertEqual(
                set(stats),
                {
                    "connects",
                    "disconnects",
                    "records_sent",
                    "records_dropped",
                    "directives",
                    "resyncs",
                    "tools_spawned",
                    "tools_unplaced",
                },
            )
            self.assertEqual(stats["tools_spawned"], 0)
            self.assertEqual(stats["connects"], 0)
            self.assertEqual(stats["records_sent"], 0)
            self.assertEqual(eng.last_error(), "")

    def test_poll_returns_nothing_within_the_timeout(self):
        with self.engine() as eng:
            start = time.monotonic()
            self.assertEqual(eng.poll(timeout_ms=100), [])
            elapsed = time.monotonic() - start
            self.assertGreaterEqual(elapsed, 0.09)
            self.assertLess(elapsed, 5.0)
            self.assertEqual(eng.poll(), [])
            self.assertEqual(eng.poll(max=0), [])

    def test_plan_step_runs_the_local_policy(self):
        with self.engine() as eng:
            self.assertEqual(eng.policy, "fcfs")
            reqs = [
                tandem.StepRequest(id=1, session="a", round=0, phase=tandem.RequestPhase.WAITING, prompt_tokens=300),
                tandem.StepRequest(id=2, session="b", round=0, phase=tandem.RequestPhase.WAITING, prompt_tokens=200),
            ]
            plan = eng.plan_step(reqs, free_blocks=500, now_ns=1_000_000)
            self.assertIsInstance(plan, tandem.StepPlan)
            self.assertEqual(sorted(c.request for c in plan.run), [0, 1])
            self.assertLessEqual(sum(c.tokens for c in plan.run), ENGINE["token_budget"])
            self.assertEqual(plan.preempt, [])
            self.assertEqual(plan.unpin, [])
            # An empty step plans nothing.
            self.assertEqual(eng.plan_step([], free_blocks=500), tandem.StepPlan([], [], []))

    def test_keep_decision_answers(self):
        with self.engine() as eng:
            decision, _until = eng.keep_decision("a", tool_follows=True, tool_kind="pytest", context_tokens=1000,
                                                 blocks=63)
            self.assertIn(decision, list(tandem.KeepDecision))

    def test_runner_calls_succeed(self):
        with tandem.Runner(runtime_dir=self.dir, name="py-runner") as run:
            self.assertFalse(run.connected())
            sid = run.session_open("task-1", priority_class=1, expected_rounds=5)
            self.assertEqual(sid, tandem.session_id("task-1"))
            run.tool_begin(sid, "pytest", call=1, pid=os.getpid())
            run.tool_end(sid, "pytest", call=1, exit_code=0)
            run.tool_begin(sid, "Read", call=2)
            run.tool_end(sid, "Read", call=2, exit_code=-9, wall_ns=1_000_000, cpu_ns=500_000)
            self.assertEqual(run.poll(timeout_ms=10), [])
            run.session_close(sid, tandem.CloseReason.CANCELLED)

    def test_close_is_idempotent_and_later_calls_fail(self):
        eng = self.engine()
        eng.close()
        eng.close()
        self.assertTrue(eng.closed)
        with self.assertRaises(tandem.TandemError) as cm:
            eng.connected()
        self.assertEqual(cm.exception.errno, errno.EBADF)


class ErrorTest(unittest.TestCase):
    def setUp(self):
        self._dir = tempfile.TemporaryDirectory(prefix="tandem-py-")
        self.dir = self._dir.name

    def tearDown(self):
        self._dir.cleanup()

    def assertErrno(self, code, fn, *args, **kw):
        with self.assertRaises(tandem.TandemError) as cm:
            fn(*args, **kw)
        self.assertIsInstance(cm.exception, OSError)
        self.assertEqual(cm.exception.errno, code, cm.exception)
        self.assertTrue(cm.exception.strerror, "the error carries a message")
        return cm.exception

    def test_bad_engine_params_are_einval(self):
        params = dict(ENGINE, runtime_dir=self.dir)
        params["block_size"] = 0
        self.assertErrno(errno.EINVAL, tandem.Engine, **params)
        self.assertErrno(errno.EINVAL, tandem.Engine, runtime_dir=self.dir)  # every size 0

    def test_values_that_do_not_fit_c_are_einval(self):
        params = dict(ENGINE, runtime_dir=self.dir)
        params["total_blocks"] = -1
        self.assertErrno(errno.EINVAL, tandem.Engine, **params)
        params["total_blocks"] = 2**32
        self.assertErrno(errno.EINVAL, tandem.Engine, **params)
        params["total_blocks"] = "many"
        self.assertErrno(errno.EINVAL, tandem.Engine, **params)
        with tandem.Engine(runtime_dir=self.dir, **ENGINE) as eng:
            self.assertErrno(errno.EINVAL, eng.round_submit, 1, 0, prompt_tokens=-5)
            self.assertErrno(errno.EINVAL, eng.poll, timeout_ms=-1)
            self.assertErrno(errno.EINVAL, eng.session_runnable, 2**64)

    def test_library_checks_are_einval_with_its_message(self):
        with tandem.Engine(runtime_dir=self.dir, **ENGINE) as eng:
            e = self.assertErrno(errno.EINVAL, eng.round_submit, "s", 0, prompt_tokens=10, cached_tokens=20)
            self.assertEqual(e.strerror.split(":")[0], "tandem_round_submit")
            self.assertIn(eng.last_error(), e.strerror)
        with tandem.Runner(runtime_dir=self.dir) as run:
            self.assertErrno(errno.EINVAL, run.session_open, "")

    def test_wrong_role_and_state(self):
        with tandem.Engine(runtime_dir=self.dir, **ENGINE) as eng:
            self.assertErrno(errno.EPERM, lambda: tandem.Runner.session_open(eng, "x"))
            eng.round_submit("s", 0, prompt_tokens=10)
            self.assertErrno(errno.EBUSY, eng.round_submit, "s", 1, prompt_tokens=10)
        with tandem.Runner(runtime_dir=self.dir) as run:
            self.assertErrno(errno.EPERM, lambda: tandem.Engine.round_submit(run, "s", 0, 10))
            run.session_open("x")
            self.assertErrno(errno.EEXIST, run.session_open, "x")
            self.assertErrno(errno.ENOENT, run.session_close, "never-opened")


class ToolProcessTest(unittest.TestCase):
    """Runner.tool_spawn / tool_wait / tool_kill without a daemon: the tools
    start unplaced (fail-open)."""

    SH = "/bin/sh"

    def setUp(self):
        self._dir = tempfile.TemporaryDirectory(prefix="tandem-py-")
        self.dir = self._dir.name
        self.run_ = tandem.Runner(runtime_dir=self.dir, name="py-tools")
        self.sid = self.run_.session_open("tools")

    def tearDown(self):
        self.run_.close()  # kills and reaps any tool a failed test left
        self._dir.cleanup()

    def assertErrno(self, code, fn, *args, **kw):
        with self.assertRaises(tandem.TandemError) as cm:
            fn(*args, **kw)
        self.assertEqual(cm.exception.errno, code, cm.exception)
        self.assertTrue(cm.exception.strerror, "the error carries a message")
        return cm.exception

    def sh(self, script, **kw):
        return self.run_.tool_spawn(self.sid, "sh", [self.SH, "-c", script], **kw)

    def test_true_runs_unplaced_and_is_counted(self):
        pid = self.run_.tool_spawn(self.sid, "true", ["/bin/true"])
        self.assertGreater(pid, 0)
        self.assertNotEqual(pid, os.getpid())
        res = self.run_.tool_wait(pid)
        self.assertIsInstance(res, tandem.ToolResult)
        self.assertEqual(res.exit_code, 0)
        self.assertIs(res.reason, tandem.ToolExitReason.EXITED)
        self.assertEqual(res.cgroup_id, 0)  # no daemon: no cgroup
        self.assertEqual(res.message, "")
        self.assertGreater(res.wall_ns, 0)
        self.assertIn("without a cgroup", self.run_.last_error())
        stats = self.run_.stats()
        self.assertEqual(stats["tools_spawned"], 1)
        self.assertEqual(stats["tools_unplaced"], 1)
        # Reaped: the pid is no tool of this handle any more.
        self.assertErrno(errno.ECHILD, self.run_.tool_wait, pid, 0)

    def test_argv0_is_searched_in_path(self):
        pid = self.run_.tool_spawn(self.sid, "true", ["true"])
        self.assertEqual(self.run_.tool_wait(pid).exit_code, 0)

    def test_exit_status_is_reported(self):
        res = self.run_.tool_wait(self.sh("exit 3"))
        self.assertEqual(res.exit_code, 3)
        self.assertIs(res.reason, tandem.ToolExitReason.EXITED)

    def test_limits_are_accepted_fail_open(self):
        pid = self.sh(
            "exit 0",
            cpu_quota_us=50_000,
            cpu_period_us=100_000,
            memory_high=256 << 20,
            memory_max=512 << 20,
            pids_max=64,
            low_priority=True,
        )
        self.assertEqual(self.run_.tool_wait(pid).exit_code, 0)

    def test_stdio_env_and_cwd_reach_the_tool(self):
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        os.write(in_w, b"world\n")
        os.close(in_w)
        with os.fdopen(in_r, "rb") as stdin, os.fdopen(out_r, "rb") as out, tempfile.TemporaryFile() as err:
            try:
                pid = self.sh(
                    'echo "$GREETING $(pwd)"; echo oops >&2; read line; echo "got $line"',
                    env={"GREETING": "hello"},
                    cwd=self.dir,
                    stdin=stdin,  # objects with fileno()
                    stdout=out_w,  # a plain fd
                    stderr=err,
                )
            finally:
                os.close(out_w)  # the tool holds its own copy
            res = self.run_.tool_wait(pid, timeout_ms=10_000)
            self.assertEqual(res.exit_code, 0)
            self.assertEqual(out.read().decode(), f"hello {os.path.realpath(self.dir)}\ngot world\n")
            err.seek(0)
            self.assertEqual(err.read(), b"oops\n")

    def test_empty_env_replaces_the_environment(self):
        r, w = os.pipe()
        with os.fdopen(r, "rb") as f:
            try:
                pid = self.sh('echo "[${HOME-unset}]"', env={}, stdout=w)
            finally:
                os.close(w)
            self.assertEqual(self.run_.tool_wait(pid).exit_code, 0)
            self.assertEqual(f.read(), b"[unset]\n")

    def test_wait_times_out_then_kill_is_signaled(self):
        pid = self.sh("exec sleep 30")
        with self.assertRaises(TimeoutError) as cm:
            self.run_.tool_wait(pid, timeout_ms=0)
        self.assertIsInstance(cm.exception, tandem.TandemTimeoutError)
        self.assertEqual(cm.exception.errno, errno.ETIMEDOUT)
        with self.assertRaises(tandem.TandemError):
            self.run_.tool_wait(pid, timeout_ms=50)
        self.run_.tool_kill(pid)
        res = self.run_.tool_wait(pid, timeout_ms=10_000)
        self.assertEqual(res.exit_code, -signal.SIGKILL)
        self.assertIs(res.reason, tandem.ToolExitReason.SIGNALED)
        self.assertIn(str(int(signal.SIGKILL)), res.message)
        self.assertLess(res.wall_ns, 30 * 10**9)
        self.assertErrno(errno.ECHILD, self.run_.tool_kill, pid)

    def test_bad_arguments_raise(self):
        run, sid = self.run_, self.sid
        e = self.assertErrno(errno.EINVAL, run.tool_spawn, sid, "t", [])
        self.assertIn("argv", e.strerror)
        self.assertEqual(e.strerror.split(":")[0], "tandem_tool_spawn")
        self.assertErrno(errno.EINVAL, run.tool_spawn, sid, "t", "/bin/true")  # a str, not a list
        self.assertErrno(errno.EINVAL, run.tool_spawn, sid, "t", ["/bin/true", "a\0b"])
        self.assertErrno(errno.EINVAL, run.tool_spawn, sid, "t", ["/bin/true", 5])
        self.assertErrno(errno.EINVAL, run.tool_spawn, sid, "", ["/bin/true"])
        self.assertErrno(errno.EINVAL, run.tool_spawn, sid, "t", ["/bin/true"], env={"A=B": "c"})
        self.assertErrno(errno.EINVAL, run.tool_spawn, sid, "t", ["/bin/true"], env=["A=b"])
        # Checked by the library:
        e = self.assertErrno(errno.EINVAL, run.tool_spawn, sid, "t", ["/bin/true"], cpu_quota_us=10)
        self.assertIn("cpu_quota_us", e.strerror)
        self.assertIn(run.last_error(), e.strerror)
        self.assertErrno(errno.EINVAL, run.tool_spawn, sid, "t", ["/bin/true"], memory_high=2, memory_max=1)
        self.assertErrno(errno.EINVAL, run.tool_spawn, sid, "t", ["/bin/true"], stdout=-1)
        # Out of the C type's range, and fd 0 where C would read "inherit":
        self.assertErrno(errno.EINVAL, run.tool_spawn, sid, "t", ["/bin/true"], memory_max=-1)
        self.assertErrno(errno.EINVAL, run.tool_spawn, sid, "t", ["/bin/true"], cpu_quota_us=2**32)
        self.assertErrno(errno.EINVAL, run.tool_spawn, sid, "t", ["/bin/true"], stdout=0)
        self.assertErrno(errno.EINVAL, run.tool_wait, 2**31)
        # State:
        self.assertErrno(errno.ENOENT, run.tool_spawn, "never-opened", "t", ["/bin/true"])
        e = self.assertErrno(errno.ENOENT, run.tool_spawn, sid, "t", [os.path.join(self.dir, "no-such-tool")])
        self.assertIn("no-such-tool", e.strerror)
        self.assertErrno(errno.ECHILD, run.tool_wait, os.getpid(), 0)
        self.assertErrno(errno.ECHILD, run.tool_kill, os.getpid())
        # Nothing above started a tool.
        self.assertEqual(run.stats()["tools_spawned"], 0)
        with tandem.Engine(runtime_dir=self.dir, **ENGINE) as eng:
            self.assertErrno(errno.EPERM, lambda: tandem.Runner.tool_spawn(eng, 1, "t", ["/bin/true"]))
            self.assertErrno(errno.EPERM, lambda: tandem.Runner.tool_wait(eng, 1, 0))
            self.assertErrno(errno.EPERM, lambda: tandem.Runner.tool_kill(eng, 1))


if __name__ == "__main__":
    unittest.main()
