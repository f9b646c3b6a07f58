"""The ctypes binding of libtandem (libclient/python/tandem).

- Layout: every ctypes Structure has the size, field names, offsets and
  field sizes the C compiler gives the tandem.h / tandem_gpu.h struct
  (printed by the tandem_abi_layout helper, $TANDEM_ABI_HELPER), and the
  GPU enums and array bounds match.
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
- GPU plane (tandem_gpu.h) on the simulated device, without a daemon: Gpu
  pools (generated and explicit, stages, streams, partitions, switching,
  info), an engine's pool (one per engine, fail-open begin_pass, closed with
  the engine), the engine's profile / weight module / offload plan, and
  LayerStreamer passes over the pool's streams; bad options and calls raise
  EINVAL/ENOENT/ERANGE/EPERM/EBUSY/EBADF with the message naming the field.

Run by ctest (tests/python/CMakeLists.txt), which sets TANDEM_LIBRARY,
TANDEM_ABI_HELPER and PYTHONPATH.
"""

import array
import ctypes
import errno
import gc
import math
import os
import re
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

    def test_every_struct_and_field_of_the_headers_is_checked(self):
        # A member added to tandem.h or tandem_gpu.h must reach the helper
        # (abi_layout_gen.py lists the headers' members for it at build time)
        # and _ffi.py, even where padding keeps sizeof the same. The headers
        # are read here a second way, so a definition the generator skipped
        # fails too.
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "libclient", "include", "tandem")
        seen = 0
        for header in ("tandem.h", "tandem_gpu.h"):
            with open(os.path.join(root, header)) as f:
                text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
            for name, body in re.findall(r"typedef struct (\w+) \{(.*?)\} \1;", text, flags=re.S):
                seen += 1
                members = [re.split(r"[\s*]+", d.split("[")[0].strip())[-1] for d in body.split(";") if d.strip()]
                with self.subTest(struct=name):
                    self.assertEqual([m[0] for m in self.fields.get(name, [])], members)
        self.assertEqual(seen, len(_ffi.STRUCTS))

    def test_tool_structs_are_checked(self):
        # The structs of the tool-process API, and the stats grown for it.
        for cname in ("tandem_tool_options", "tandem_tool_result", "tandem_tool_info"):
            self.assertIn(cname, _ffi.STRUCTS)
            self.assertIn(cname, self.sizes)
        self.assertEqual(ctypes.sizeof(_ffi.ToolOptions), self.sizes["tandem_tool_options"])
        self.assertEqual(ctypes.sizeof(_ffi.ToolResultC), self.sizes["tandem_tool_result"])
        stats = [name for name, _, _ in self.fields["tandem_client_stats"]]
        self.assertEqual(
            stats[-5:], ["tools_spawned", "tools_unplaced", "daemon_errors", "sessions_refused", "tools_placed_ahead"]
        )

    def test_tool_flags_and_directives_match_c(self):
        self.assertEqual(
            {f"TANDEM_TOOL_{k.name}": k.value for k in tandem.ToolFlags},
            {k: v for k, v in self.enums.items() if k in (
                "TANDEM_TOOL_UNPLACED", "TANDEM_TOOL_CGROUP_NS", "TANDEM_TOOL_UID_CHANGED", "TANDEM_TOOL_DAEMON_LOST")},
        )
        self.assertEqual(tandem.DirectiveType.CLOSE, self.enums["TANDEM_DIR_CLOSE"])

    def test_gpu_structs_are_checked(self):
        for cname in (
            "tandem_gpu_partition",
            "tandem_gpu_options",
            "tandem_gpu_info",
            "tandem_profile_row",
            "tandem_weight_module_info",
            "tandem_streamer_options",
            "tandem_streamer_info",
        ):
            self.assertIn(cname, _ffi.STRUCTS)
            self.assertIn(cname, self.sizes)

    def test_gpu_enums_and_bounds_match_c(self):
        self.assertEqual(
            {f"TANDEM_GPU_STAGE_{k.name}": k.value for k in tandem.GpuStageKind},
            {k: v for k, v in self.enums.items() if k.startswith("TANDEM_GPU_STAGE_")},
        )
        self.assertEqual(tandem.GPU_MAX_STAGES, self.enums["TANDEM_GPU_MAX_STAGES"])
        self.assertEqual(tandem.GPU_MAX_PARTITIONS, self.enums["TANDEM_GPU_MAX_PARTITIONS"])

    def test_tool_exit_reasons_match_c(self):
        self.assertEqual(
            {f"TANDEM_TOOL_{r.name}": r.value for r in tandem.ToolExitReason},
            {k: v for k, v in self.enums.items() if k.startswith("TANDEM_TOOL_") and k[12:] in ToolExitReasonNames},
        )


ToolExitReasonNames = {r.name for r in tandem.ToolExitReason}


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
            eng.kv_blocks(s1, tandem.KvBlocksOp.STORED, [1, 2, 3, 4], block_size=16, parent=7)
            eng.kv_blocks(s1, tandem.KvBlocksOp.REMOVED, [3, 4], medium=tandem.KvMedium.CPU)
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
                    "daemon_errors",
                    "sessions_refused",
                    "tools_placed_ahead",
                },
            )
            self.assertEqual(stats["tools_spawned"], 0)
            self.assertEqual(stats["connects"], 0)
            self.assertEqual(stats["records_sent"], 0)
            self.assertEqual(eng.last_error(), "")

    def test_kv_blocks_checks_its_fields(self):
        with self.engine() as eng:
            s = tandem.session_id("kv")
            with self.assertRaises(tandem.TandemError) as bad:
                eng.kv_blocks(s, tandem.KvBlocksOp.STORED, [1], block_size=0)
            self.assertIn("block_size", str(bad.exception))
            with self.assertRaises(tandem.TandemError) as bad:
                eng.kv_blocks(s, tandem.KvBlocksOp.STORED, [], block_size=16)
            self.assertIn("count", str(bad.exception))

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
            self.assertEqual(plan.swap, [])
            # An empty step plans nothing.
            self.assertEqual(eng.plan_step([], free_blocks=500), tandem.StepPlan([], [], [], []))

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
    """Runner.tool_spawn / tool_wait / tool_kill without a daemon: a tool
    that cannot be placed in a cgroup is not started, unless the caller
    allows it (allow_unplaced=True); these tests allow it."""

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
        kw.setdefault("allow_unplaced", True)
        return self.run_.tool_spawn(self.sid, "sh", [self.SH, "-c", script], **kw)

    def test_without_a_cgroup_nothing_starts_unless_allowed(self):
        marker = os.path.join(self.dir, "ran")
        e = self.assertErrno(errno.ENOTCONN, self.run_.tool_spawn, self.sid, "touch", ["/bin/touch", marker])
        self.assertIn("could not be placed in a cgroup", e.strerror)
        self.assertIn("TANDEM_TOOL_ALLOW_UNPLACED", e.strerror)
        self.assertFalse(os.path.exists(marker))
        self.assertEqual(self.run_.stats()["tools_spawned"], 0)

    def test_true_runs_unplaced_and_is_counted(self):
        pid = self.run_.tool_spawn(self.sid, "true", ["/bin/true"], allow_unplaced=True)
        self.assertGreater(pid, 0)
        self.assertNotEqual(pid, os.getpid())
        info = self.run_.tool_info(pid)
        self.assertIsInstance(info, tandem.ToolInfo)
        self.assertEqual(info.cgroup_id, 0)
        self.assertTrue(info.flags & tandem.ToolFlags.UNPLACED)
        self.assertEqual(info.uid, os.geteuid())
        res = self.run_.tool_wait(pid)
        self.assertTrue(res.flags & tandem.ToolFlags.UNPLACED)
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
        pid = self.run_.tool_spawn(self.sid, "true", ["true"], allow_unplaced=True)
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
        e = self.assertErrno(
            errno.ENOENT, run.tool_spawn, sid, "t", [os.path.join(self.dir, "no-such-tool")], allow_unplaced=True
        )
        self.assertIn("no-such-tool", e.strerror)
        self.assertErrno(errno.ECHILD, run.tool_wait, os.getpid(), 0)
        self.assertErrno(errno.ECHILD, run.tool_kill, os.getpid())
        self.assertErrno(errno.ECHILD, run.tool_info, os.getpid())
        self.assertErrno(errno.EINVAL, run.tool_spawn, sid, "t", ["/bin/true"], uid=-1)
        # Nothing above started a tool.
        self.assertEqual(run.stats()["tools_spawned"], 0)
        with tandem.Engine(runtime_dir=self.dir, **ENGINE) as eng:
            self.assertErrno(errno.EPERM, lambda: tandem.Runner.tool_spawn(eng, 1, "t", ["/bin/true"]))
            self.assertErrno(errno.EPERM, lambda: tandem.Runner.tool_wait(eng, 1, 0))
            self.assertErrno(errno.EPERM, lambda: tandem.Runner.tool_kill(eng, 1))


class _TempDirTest(unittest.TestCase):
    def setUp(self):
        self._dir = tempfile.TemporaryDirectory(prefix="tandem-py-")
        self.dir = self._dir.name

    def tearDown(self):
        self._dir.cleanup()

    def engine(self):
        return tandem.Engine(runtime_dir=self.dir, name="py-gpu", **ENGINE)

    def assertErrno(self, code, fn, *args, **kw):
        with self.assertRaises(tandem.TandemError) as cm:
            fn(*args, **kw)
        self.assertEqual(cm.exception.errno, code, cm.exception)
        self.assertTrue(cm.exception.strerror, "the error carries a message")
        return cm.exception


class GpuTest(_TempDirTest):
    """Gpu pools on the simulated device, without a daemon."""

    def test_generated_pool(self):
        with tandem.Gpu(backend="sim") as gpu:
            self.assertEqual(gpu.backend, "sim")
            self.assertIsNone(gpu.engine)
            self.assertEqual(gpu.last_error(), "")
            info = gpu.info()
            self.assertIsInstance(info, tandem.GpuInfo)
            self.assertIn("simulated", info.device_name)
            self.assertEqual(info.device_sms, 132)
            self.assertGreater(info.total_memory, 0)
            self.assertEqual(info.n_stages, 2)
            self.assertEqual(info.n_partitions, 7)
            self.assertEqual(info.decode_sms, (16, 24, 32, 40, 48, 56, 64))
            self.assertEqual(info.active_partition, 6)  # the most decode SMs
            self.assertEqual((info.switches, info.bad_indices), (0, 0))
            self.assertEqual(gpu.stage("prefill"), 0)
            self.assertEqual(gpu.stage("decode"), 1)
            e = self.assertErrno(errno.ENOENT, gpu.stage, "vision")
            self.assertEqual(e.strerror, "tandem_gpu_stage: no stage 'vision' in the pool")
            self.assertEqual(gpu.last_error(), e.strerror)
            # SMs per (partition, stage), a stage by index or by name.
            self.assertEqual(gpu.partition_sms(0, "decode"), 16)
            self.assertEqual(gpu.partition_sms(0, 0), 116)
            self.assertEqual(gpu.partition_sms(6, "prefill"), 68)
            e = self.assertErrno(errno.EINVAL, gpu.partition_sms, 7, 0)
            self.assertIn("partition 7 is out of range", e.strerror)
            self.assertErrno(errno.EINVAL, gpu.partition_sms, 0, 2)
            # Streams: non-zero ints, one per stage, stable within a pass.
            sp, sd = gpu.stream("prefill"), gpu.stream(1)
            self.assertIsInstance(sd, int)
            self.assertNotEqual(sp, 0)
            self.assertNotEqual(sd, 0)
            self.assertNotEqual(sp, sd)
            self.assertEqual(gpu.stream("decode"), sd)
            e = self.assertErrno(errno.EINVAL, gpu.stream, 2)
            self.assertEqual(e.strerror, "tandem_gpu_stream: stage 2 is out of range (the pool has 2 stages)")
            self.assertErrno(errno.ENOENT, gpu.stream, "vision")
            self.assertErrno(errno.EINVAL, gpu.stream, -1)
            # Contexts: one per stage in a partition, another after a switch.
            cp, cd = gpu.context("prefill"), gpu.context("decode")
            self.assertNotEqual(cp, 0)
            self.assertNotEqual(cp, cd)
            gpu.set_partition(0)
            self.assertNotEqual(gpu.context("decode"), cd)
            e = self.assertErrno(errno.EINVAL, gpu.context, 2)
            self.assertEqual(e.strerror, "tandem_gpu_context: stage 2 is out of range (the pool has 2 stages)")
            self.assertIn("sim", repr(gpu))

    def test_switching_partitions(self):
        with tandem.Gpu(backend="sim") as gpu:
            sd = gpu.stream("decode")
            # No engine: begin_pass keeps the partition.
            self.assertEqual(gpu.begin_pass(), 6)
            self.assertEqual(gpu.stream("decode"), sd)
            gpu.set_partition(2)
            self.assertNotEqual(gpu.stream("decode"), sd)
            self.assertEqual(gpu.begin_pass(), 2)
            e = self.assertErrno(errno.ERANGE, gpu.set_partition, 7)
            self.assertEqual(
                e.strerror, "tandem_gpu_set_partition: partition index 7 is out of range: the pool has 7 partitions"
            )
            info = gpu.info()
            self.assertEqual(info.active_partition, 2)
            self.assertEqual(info.switches, 1)
            self.assertEqual(info.bad_indices, 1)
            self.assertErrno(errno.EINVAL, gpu.set_partition, -1)  # not a uint32_t

    def test_explicit_partitions_three_stages_and_a_full_device(self):
        with tandem.Gpu(
            backend="sim",
            stages=("vision", "prefill", "decode"),
            partitions=[(16, 0, 24), [16, 0, 48]],  # 0: the rest
            full_device=True,
            stage_priorities=(0, -1, -5),
        ) as gpu:
            info = gpu.info()
            self.assertEqual(info.n_stages, 3)
            self.assertEqual(info.decode_sms, (24, 48, 132))
            self.assertEqual(info.active_partition, 2, "the full device until told otherwise")
            self.assertEqual(gpu.stage("vision"), 0)
            self.assertEqual(gpu.partition_sms(0, "prefill"), 132 - 16 - 24)
            self.assertEqual(gpu.partition_sms(1, "prefill"), 132 - 16 - 48)
            self.assertEqual(gpu.partition_sms(2, "vision"), 132)
            self.assertEqual(len({gpu.stream(i) for i in range(3)}), 3)

    def test_generated_pool_options_and_sim_sms(self):
        with tandem.Gpu(backend="sim", decode_min_sms=32, decode_max_sms=48, decode_step_sms=16) as gpu:
            self.assertEqual(gpu.info().decode_sms, (32, 48))
        with tandem.Gpu(backend="sim", sim_sms=114) as gpu:
            info = gpu.info()
            self.assertEqual(info.device_sms, 114)
            # 114 = 14 blocks of 8 + a 2-SM remainder, which the rest takes.
            self.assertEqual(gpu.partition_sms(0, "prefill"), 114 - 16)

    def test_auto_and_cuda_backends(self):
        try:
            gpu = tandem.Gpu(backend="cuda")
        except tandem.TandemError as e:
            self.assertEqual(e.errno, errno.ENODEV, e)
            self.assertIn("CUDA device 0", e.strerror)
            # "auto" then takes the simulated device.
            with tandem.Gpu() as gpu:
                self.assertEqual(gpu.backend, "sim")
            return
        with gpu:
            self.assertEqual(gpu.backend, "cuda")
        self.skipTest("a CUDA driver and device are present")

    def test_bad_options_name_the_field(self):
        cases = [
            # Checked by the library:
            (dict(backend="opencl"), "tandem_gpu_open: options->backend 'opencl' is not"),
            (dict(ordinal=-1), "tandem_gpu_open: options->ordinal -1 is not in 0..1023"),
            (dict(stages=["decode"]), "tandem_gpu_open: options->n_stages 1 is outside 2..4"),
            (dict(stages=["decode", "decode"]), "tandem_gpu_open: options->stages[1] 'decode' repeats stages[0]"),
            (dict(stages=["a", "b", "decode"]), "tandem_gpu_open: options->partitions is NULL (a generated pool)"),
            (dict(partitions=[]), "tandem_gpu_open: options->n_partitions"),
            (dict(partitions=[(0, 32, 8)]), "tandem_gpu_open: options->partitions[0].sms[2] is 8"),
            (dict(partitions=[(0, 30)]), "tandem_gpu_open: partition 0: stage 'decode': 30 SMs is not a multiple"),
            (dict(decode_min_sms=64, decode_max_sms=32), "tandem_gpu_open: options->decode_min_sms 64 is above"),
            (
                dict(decode_min_sms=4, decode_max_sms=128, decode_step_sms=4),
                "tandem_gpu_open: two-stage pool: decode SMs [4, 128] by 4 make 31 partitions",
            ),
            # Checked here, before C could read past what it was given:
            (dict(backend=5), "backend: expected a string"),
            (dict(stages="decode"), "stages: expected a sequence"),
            (dict(stages=["prefill", "de\0code"]), "stages[1]: contains a NUL byte"),
            (dict(partitions=[(8, 8, 8, 8, 8)]), "partitions[0]: 5 SM counts, at most 4"),
            (dict(partitions=[(0, -8)]), "partitions[0][1]: -8 is out of range"),
            (dict(partitions=[8]), "partitions[0]: expected a sequence"),
            (dict(stage_priorities=(0,)), "stage_priorities: 1 values for 2 stages"),
            (dict(stages=("a", "b", "c"), stage_priorities=(0, 0)), "stage_priorities: 2 values for 3 stages"),
            (dict(stage_priorities=(0, 2**31)), "stage_priorities[1]: 2147483648 is out of range"),
            (dict(ordinal=2**31), "ordinal: 2147483648 is out of range"),
            (dict(sim_sms=-1), "sim_sms: -1 is out of range"),
        ]
        for kw, message in cases:
            with self.subTest(**{k: repr(v) for k, v in kw.items()}):
                args = dict(backend="sim")
                args.update(kw)
                e = self.assertErrno(errno.EINVAL, tandem.Gpu, **args)
                self.assertTrue(e.strerror.startswith(message), e.strerror)
        e = self.assertErrno(errno.EINVAL, tandem.Gpu, "engine", backend="sim")
        self.assertIn("engine: expected a tandem.Engine", e.strerror)

    def test_an_engines_pool(self):
        eng = self.engine()  # nothing listens: fail-open
        gpu = tandem.Gpu(eng, backend="sim")
        self.assertIs(gpu.engine, eng)
        # One pool per engine.
        e = self.assertErrno(errno.EBUSY, tandem.Gpu, eng, backend="sim")
        self.assertEqual(e.strerror, "tandem_gpu_open: client already has an open tandem_gpu (one pool per engine)")
        self.assertEqual(eng.last_error(), e.strerror)
        self.assertEqual(gpu.begin_pass(), 6)
        gpu.set_partition(3)
        self.assertEqual(gpu.begin_pass(), 3, "fail-open: the current partition stays")
        gpu.close()
        gpu = tandem.Gpu(eng, backend="sim")  # closing freed the engine's pool slot
        # Closing the engine closes its pool first.
        eng.close()
        self.assertTrue(gpu.closed)
        e = self.assertErrno(errno.EBADF, gpu.stream, 0)
        self.assertIn("tandem_gpu handle is closed", e.strerror)
        self.assertEqual(gpu.last_error(), "")
        gpu.close()  # idempotent
        self.assertErrno(errno.EBADF, tandem.Gpu, eng, backend="sim")  # a closed engine

    def test_a_dropped_pool_frees_the_engines_slot(self):
        with self.engine() as eng:
            gpu = tandem.Gpu(eng, backend="sim")
            del gpu  # collected: closed by __del__
            with tandem.Gpu(eng, backend="sim") as gpu:
                self.assertEqual(gpu.backend, "sim")
            self.assertTrue(gpu.closed)

    def test_a_pool_in_a_garbage_cycle_with_its_engine(self):
        # Whichever of the two the collector finalizes first, the pool is
        # closed before its engine (C reads the client in tandem_gpu_close).
        order = []
        lib = _ffi.load()

        class Recorder:  # the engine's library, recording tandem_close
            def __getattr__(self, name):
                return getattr(lib, name)

            def tandem_close(self, handle):
                order.append("engine")
                lib.tandem_close(handle)

        def gpu_close(handle):
            order.append("gpu")
            lib.tandem_gpu_close(handle)

        eng = self.engine()
        eng._lib = Recorder()
        gpu = tandem.Gpu(eng, backend="sim")
        gpu._res._destroy = gpu_close
        res = gpu._res
        eng.cycle, gpu.cycle = gpu, eng
        del eng, gpu
        # CPython finalizes the engine first here (the older object): without
        # the engine closing its pool, tandem_gpu_close would then read the
        # freed client.
        gc.collect()
        self.assertFalse(res.ptr)
        self.assertEqual(order, ["gpu", "engine"])

    def test_runner_cannot_open_a_pool(self):
        with tandem.Runner(runtime_dir=self.dir) as run:
            e = self.assertErrno(errno.EPERM, tandem.Gpu, run, backend="sim")
            self.assertEqual(e.strerror, "tandem_gpu_open: client is not an engine handle")
            self.assertEqual(run.last_error(), e.strerror)


class GpuRecordsTest(_TempDirTest):
    """Engine.gpu_profile / weight_module / offload_plan without a daemon."""

    MODULE = dict(index=3, name="mlp", layers=32, slots=2, layer_compute_us=150, bytes=8 << 30)

    def test_records_are_accepted_fail_open(self):
        with self.engine() as eng:
            eng.gpu_profile(tandem.GpuStageKind.DECODE, [tandem.ProfileRow(16, 0.020, 50.0), (32, 0.012, 80)])
            eng.gpu_profile(tandem.GpuStageKind.PREFILL, [(64, 1, 0)])  # ints are numbers too
            eng.weight_module(**self.MODULE)
            eng.weight_module(**dict(self.MODULE, slots=4))  # replaces module 3
            plan = eng.offload_plan()
            self.assertIsInstance(plan, tandem.OffloadPlan)
            self.assertEqual(plan, (0, 0))
            self.assertEqual(plan.modules, [])
            self.assertEqual(eng.last_error(), "")

    def test_offload_plan_modules(self):
        plan = tandem.OffloadPlan(plan=(1 << 63) | 0b1010, freed_bytes=5)
        self.assertEqual(plan.modules, [1, 3, 63])
        self.assertEqual(plan.freed_bytes, 5)

    def test_bad_profiles_name_the_row_and_field(self):
        good = [(16, 0.02, 50.0), (32, 0.01, 80.0)]
        with self.engine() as eng:
            cases = [
                (2, good, "tandem_gpu_profile: stage 2 is not TANDEM_GPU_STAGE_DECODE (0)"),
                (0, [], "tandem_gpu_profile: count 0 is outside 1..64"),
                (0, [(i + 1, 0.01, 1.0) for i in range(65)], "tandem_gpu_profile: count 65 is outside 1..64"),
                (0, [(32, 0.01, 1.0), (32, 0.01, 1.0)], "tandem_gpu_profile: rows[1].sm_count 32 is not above"),
                (0, [(0, 0.01, 1.0)], "tandem_gpu_profile: rows[0].sm_count is 0"),
                (0, [(16, 0.01, 1.0), (40, 0.0, 1.0)], "tandem_gpu_profile: rows[1].latency_s 0 is not finite"),
                (0, [(16, math.inf, 1.0)], "tandem_gpu_profile: rows[0].latency_s inf is not finite"),
                (0, [(16, 0.01, -1.0)], "tandem_gpu_profile: rows[0].throughput -1 is not finite and >= 0"),
                (0, [(16, "fast", 1.0)], "rows[0].latency_s: expected a number, got str"),
                (0, [(-16, 0.01, 1.0)], "rows[0].sm_count: -16 is out of range"),
                (0, 16, "rows: expected a sequence"),
                (2**31, good, "stage: 2147483648 is out of range"),
            ]
            for stage, rows, message in cases:
                with self.subTest(message=message):
                    e = self.assertErrno(errno.EINVAL, eng.gpu_profile, stage, rows)
                    self.assertTrue(e.strerror.startswith(message), e.strerror)
            with self.assertRaises(TypeError):  # a row with too few fields
                eng.gpu_profile(0, [(16, 0.01)])

    def test_bad_modules_name_the_field(self):
        cases = [
            (dict(index=64), "tandem_weight_module: module->index 64 is not below 64"),
            (dict(layers=2), "tandem_weight_module: module->layers 2 is outside 3..65535"),
            (dict(slots=32), "tandem_weight_module: module->slots 32 is outside 2..31"),
            (dict(slots=1), "tandem_weight_module: module->slots 1 is outside 2..31"),
            (dict(layer_compute_us=0), "tandem_weight_module: module->layer_compute_us is 0"),
            (dict(bytes=0), "tandem_weight_module: module->bytes is 0"),
            (dict(name=""), "tandem_weight_module: module->name must have 1 to 23 characters"),
            (dict(name="a-name-that-is-too-long-"), "tandem_weight_module: module->name must have 1 to 23"),
            (dict(name="tab\there"), "tandem_weight_module: module->name has a non-printable byte 0x09 at 3"),
            (dict(name="a\0b"), "name: contains a NUL byte"),
            (dict(name=None), "name: expected a string"),
            (dict(bytes=-1), "bytes: -1 is out of range"),
            (dict(index=2**32), "index: 4294967296 is out of range"),
        ]
        with self.engine() as eng:
            for kw, message in cases:
                with self.subTest(message=message):
                    e = self.assertErrno(errno.EINVAL, eng.weight_module, **dict(self.MODULE, **kw))
                    self.assertTrue(e.strerror.startswith(message), e.strerror)

    def test_runner_handles_cannot_send_gpu_records(self):
        with tandem.Runner(runtime_dir=self.dir) as run:
            self.assertErrno(errno.EPERM, lambda: tandem.Engine.gpu_profile(run, 0, [(16, 0.01, 1.0)]))
            self.assertErrno(errno.EPERM, lambda: tandem.Engine.weight_module(run, **self.MODULE))
            e = self.assertErrno(errno.EPERM, lambda: tandem.Engine.offload_plan(run))
            self.assertEqual(e.strerror, "tandem_offload_plan: not an engine handle")


class LayerStreamerTest(_TempDirTest):
    """LayerStreamer over a simulated pool's streams."""

    S = 4096

    def setUp(self):
        super().setUp()
        self.gpu = tandem.Gpu(backend="sim")
        self.stream = self.gpu.stream("decode")
        self.layers = [bytes([i]) * self.S for i in range(8)]

    def tearDown(self):
        self.gpu.close()
        super().tearDown()

    def test_runs_passes_over_the_pools_streams(self):
        with tandem.LayerStreamer(self.gpu, self.layers, slots=3, layer_compute_us=100) as s:
            self.assertIs(s.gpu, self.gpu)
            info = s.info()
            self.assertIsInstance(info, tandem.StreamerInfo)
            self.assertEqual((info.layers, info.slots, info.layer_bytes), (8, 3, self.S))
            self.assertEqual(info.device_bytes, 3 * self.S)
            self.assertEqual(info.freed_bytes, 5 * self.S)
            self.assertGreater(info.link_bytes_per_s, 0)  # the sim's rating
            # S/T = 4096 B / 100 µs = 40.96 MB/s, times (L-K)/(L-2) = 5/6.
            self.assertAlmostEqual(info.required_bytes_per_s, 40.96e6 * 5 / 6, delta=1)
            self.assertAlmostEqual(info.back_to_back_bytes_per_s, 40.96e6, delta=1)
            self.assertIs(info.hidden, True)
            self.assertEqual(info.slowdown_s_per_pass, 0)
            first = []
            for pass_ in range(3):
                for i in range(8):
                    ptr = s.acquire(i, self.stream)
                    self.assertNotEqual(ptr, 0)
                    if pass_ == 0:
                        first.append(ptr)
                    self.assertEqual(s.info().next_layer, (i + 1) % 8)
                    s.release(i, self.stream)
            self.assertEqual(len(set(first)), 3)  # K slots, reused in turn
            for n in range(3, 8):
                self.assertEqual(first[n], first[n - 3])
            self.assertEqual(s.info().next_layer, 0)
        self.assertTrue(s.closed)

    def test_the_stream_may_change_between_calls(self):
        s = self.gpu.streamer(self.layers, slots=2, layer_compute_us=100)
        s.acquire(0, self.stream)
        self.gpu.set_partition(0)  # a partition switch: new streams
        now = self.gpu.stream("decode")
        self.assertNotEqual(now, self.stream)
        s.release(0, now)
        s.acquire(1, self.gpu.stream("prefill"))
        s.close()
        s.close()  # idempotent

    def test_a_slow_link_is_reported(self):
        s = self.gpu.streamer(self.layers, 3, 100, link_bytes_per_s=20e6)  # below 34.13 MB/s
        info = s.info()
        self.assertIs(info.hidden, False)
        self.assertEqual(info.link_bytes_per_s, 20e6)
        self.assertAlmostEqual(info.slowdown_s_per_pass, 5 * 4096 / 20e6 - 600e-6, delta=1e-12)

    def test_host_layers_may_be_any_contiguous_buffer(self):
        S = self.S
        layers = [
            bytes(S),
            bytearray(S),
            memoryview(bytes(S)),  # read-only: copied first
            array.array("I", [7] * (S // 4)),
            memoryview(bytearray(S)).cast("B", (64, S // 64)),  # 2-D, C-contiguous
        ]
        s = tandem.LayerStreamer(self.gpu, layers, slots=2, layer_compute_us=100)
        self.assertEqual(s.info().layer_bytes, S)
        self.assertEqual(s.info().layers, 5)

    def test_host_buffers_are_read_in_place_or_copied(self):
        # What C reads: the same bytes, in place for bytes and writable
        # buffers.
        data = bytes(range(256)) * 4
        for obj, in_place in [
            (data, True),
            (bytearray(data), True),
            (array.array("B", data), True),
            (memoryview(data), False),
        ]:
            with self.subTest(kind=type(obj).__name__):
                keep = []
                addr, n = tandem._host_buffer("x", obj, keep)
                self.assertEqual(n, len(data))
                self.assertEqual(ctypes.string_at(addr, n), data)
                if isinstance(obj, bytearray):
                    self.assertEqual(addr, ctypes.addressof(ctypes.c_char.from_buffer(obj)))
                if isinstance(obj, array.array):
                    self.assertEqual(addr, obj.buffer_info()[0])
                if not in_place:
                    self.assertNotEqual(addr, ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value)

    def test_bad_create_arguments_name_the_field(self):
        L = self.layers
        cases = [
            (dict(host_layers=L, slots=8), "tandem_streamer_create: layer streamer: slots 8 must be in 2..7"),
            (dict(host_layers=L, slots=1), "tandem_streamer_create: layer streamer: slots 1 must be in 2..7"),
            (dict(host_layers=L[:2], slots=1), "tandem_streamer_create: layer streamer: layers 2 must be in 3..65535"),
            (dict(host_layers=[], slots=2), "tandem_streamer_create: layer streamer: layers 0 must be in 3..65535"),
            (dict(host_layers=[b""] * 4), "tandem_streamer_create: layer streamer: layer_bytes must be > 0"),
            (dict(layer_compute_us=0), "tandem_streamer_create: options->layer_compute_us must be > 0"),
            (dict(link_bytes_per_s=-1.0), "tandem_streamer_create: layer streamer: link_bytes_per_s -1 must be"),
            (dict(link_bytes_per_s=math.nan), "tandem_streamer_create: layer streamer: link_bytes_per_s nan must"),
            # Checked here:
            (dict(host_layers=L[:3] + [bytes(self.S - 1)]), "host_layers[3]: 4095 bytes, but host_layers[0] has 4096"),
            (dict(host_layers=[[1, 2, 3]] * 4), "host_layers[0]: expected a bytes-like object, got list"),
            (dict(host_layers=[memoryview(bytearray(16))[::2]] * 4), "host_layers[0]: the buffer is not C-contiguous"),
            (dict(host_layers=b"abcd"), "host_layers: expected a sequence"),
            (dict(link_bytes_per_s="fast"), "link_bytes_per_s: expected a number"),
            (dict(slots=-1), "slots: -1 is out of range"),
        ]
        for kw, message in cases:
            with self.subTest(message=message):
                args = dict(host_layers=self.layers, slots=3, layer_compute_us=100)
                args.update(kw)
                e = self.assertErrno(errno.EINVAL, tandem.LayerStreamer, self.gpu, **args)
                self.assertTrue(e.strerror.startswith(message), e.strerror)
        e = self.assertErrno(errno.EINVAL, tandem.LayerStreamer, "gpu", self.layers, 3, 100)
        self.assertIn("gpu: expected a tandem.Gpu", e.strerror)

    def test_protocol_errors_change_nothing(self):
        s = self.gpu.streamer(self.layers[:5], slots=2, layer_compute_us=100)
        e = self.assertErrno(errno.EINVAL, s.acquire, 1, self.stream)
        self.assertIn("acquire layer 1 out of order: layer 0 is next", e.strerror)
        self.assertTrue(e.strerror.startswith("tandem_streamer_acquire: "), e.strerror)
        self.assertEqual(self.gpu.last_error(), e.strerror)
        e = self.assertErrno(errno.EINVAL, s.acquire, 0, 0)
        self.assertIn("stream is NULL", e.strerror)
        e = self.assertErrno(errno.EINVAL, s.acquire, 0, 12345)
        self.assertIn("not a live stream of this tandem_gpu", e.strerror)
        e = self.assertErrno(errno.EINVAL, s.release, 0, self.stream)
        self.assertIn("release layer 0 without acquire", e.strerror)
        e = self.assertErrno(errno.EINVAL, s.acquire, 9, self.stream)
        self.assertIn("layer 9", e.strerror)
        self.assertErrno(errno.EINVAL, s.acquire, 0, -1)  # not a pointer value
        self.assertEqual(s.info().next_layer, 0)
        self.assertNotEqual(s.acquire(0, self.stream), 0)
        s.release(0, self.stream)
        self.assertEqual(s.info().next_layer, 1)

    def test_closing_the_gpu_destroys_its_streamers_first(self):
        a = self.gpu.streamer(self.layers, 2, 100)
        b = self.gpu.streamer(self.layers, 3, 100)
        a.close()
        self.gpu.close()
        self.assertTrue(b.closed)
        e = self.assertErrno(errno.EBADF, b.info)
        self.assertIn("tandem_layer_streamer handle is closed", e.strerror)
        self.assertErrno(errno.EBADF, tandem.LayerStreamer, self.gpu, self.layers, 2, 100)
        self.assertIn("closed", repr(b))

    def test_an_engines_pool_and_streamer_close_with_the_engine(self):
        self.gpu.close()
        eng = self.engine()
        self.gpu = tandem.Gpu(eng, backend="sim")
        s = self.gpu.streamer(self.layers, 2, 100)
        s.acquire(0, self.gpu.stream("decode"))
        eng.close()
        self.assertTrue(s.closed)
        self.assertTrue(self.gpu.closed)


if __name__ == "__main__":
    unittest.main()
