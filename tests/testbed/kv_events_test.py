#!/usr/bin/env python3
"""KV events for routers end to end (docs/daemon.md "KV events for routers"):
the real tandemd with [kv_events] on an ipc:// endpoint, tandem-engine-emu
with --kv-events on, and a ZMQ subscriber decoding vLLM's msgpack format as
llm-d's indexer does.

The sequences it checks for one session (KvEventsTest):
  - its first prefill stores its prompt's full blocks on "GPU", chained
    (each BlockStored's parent is the last hash before it), block_size 16,
    token_ids empty;
  - a second round extending the prompt stores only the new blocks, with
    the first round's last block as parent;
  - `tandemctl session evict` (DROP) removes every stored block from "GPU";
with a pool of 64 blocks (KvEventsOffloadTest), the policy's OFFLOAD moves
a session's blocks from "GPU" to "CPU" and its next round's reload moves
them back; and tandemd's status shows the endpoint and the published count, and every
message is [topic "kv@node@<engine>", 8-byte big-endian seq counting from 0
without gaps, payload].

  kv_events_test.py TANDEMD TANDEM_ENGINE_EMU TANDEMCTL [TANDEM_LLAMA MODEL.gguf]
With tandem-llama and a model, the first sequence runs on it as well
(KvEventsLlamaTest: real token ids, so only the chain's shape is checked).
Exit 77 (skip) without python3-zmq or python3-msgpack.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

try:
    import msgpack
    import zmq
except ImportError as e:  # pragma: no cover
    # python3-zmq and python3-msgpack are Debian's: under another python3
    # (a pyenv one found first on PATH), run again under the system's.
    if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3", *sys.argv])
    print(f"skipped: {e} (install python3-zmq python3-msgpack)")
    sys.exit(77)

TANDEMD, EMU, CTL = sys.argv[1:4] if len(sys.argv) >= 4 else (None, None, None)
# Optional: tandem-llama and a GGUF model (tests/engines registers that run).
LLAMA, MODEL = sys.argv[4:6] if len(sys.argv) >= 6 else (None, None)
BLOCK = 16


# The monitor event that says a connection is up and its subscription sent.
HANDSHAKE = getattr(zmq, "EVENT_HANDSHAKE_SUCCEEDED", zmq.EVENT_CONNECTED)


def monitor_saw(mon, event):
    """Whether the monitor socket `mon` reports `event` within 100 ms."""
    from zmq.utils.monitor import recv_monitor_message

    if mon.poll(100) == 0:
        return False
    return recv_monitor_message(mon)["event"] == event


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KvEventsTest(unittest.TestCase):
    EMU_ARGS = []
    ENDPOINT = None  # None: an ipc:// socket in the test's dir

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tandem-kv-events.")
        self.endpoint = self.ENDPOINT or f"ipc://{self.dir}/kv.sock"
        config = os.path.join(self.dir, "tandemd.toml")
        with open(config, "w") as f:
            f.write(
                f'runtime_dir = "{self.dir}"\n'
                '[cgroups]\nmode = "off"\n'
                '[telemetry]\nmode = "sampling"\n'
                '[metrics]\nlisten = ""\n'
                '[nvml]\nenabled = "off"\n'
                f'[kv_events]\nendpoint = "{self.endpoint}"\ntopic = "kv@node@{{engine}}"\n'
            )
        self.procs = []
        self.daemon_log = open(os.path.join(self.dir, "tandemd.log"), "w")
        self.procs.append(
            subprocess.Popen([TANDEMD, "--config", config], stdout=self.daemon_log, stderr=subprocess.STDOUT)
        )
        self.wait_for(lambda: os.path.exists(os.path.join(self.dir, "tandemd.sock")), "tandemd's socket")
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.RCVTIMEO, 100)
        if self.ENDPOINT is None:
            # PUB/SUB drops what is published before the subscriber's
            # connection is up, and a loaded machine can take long to make
            # it (a retry every 100 ms until tandemd binds): wait for it, or
            # the first prefill's events can be lost before the test looks.
            mon = self.sub.get_monitor_socket(HANDSHAKE)
            self.sub.connect(self.endpoint)
            self.wait_for(lambda: monitor_saw(mon, HANDSHAKE), "the subscriber's connection to tandemd")
            self.sub.disable_monitor()
            mon.close(0)
        self.port = free_port()
        self.emu_log = open(os.path.join(self.dir, "emu.log"), "w")
        self.procs.append(subprocess.Popen(self.engine_command(), stdout=self.emu_log, stderr=subprocess.STDOUT))
        self.wait_for(self.emu_connected, "the emulator to connect to tandemd")
        self.messages = []

    def engine_command(self):
        return [EMU, "--port", str(self.port), "--runtime-dir", self.dir, "--name", "emu-kv", "--gpu", "off",
                "--speedup", "20", "--kv-events", "on", *self.EMU_ARGS]

    def tearDown(self):
        for p in reversed(self.procs):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.sub.close(0)
        self.ctx.term()
        self.daemon_log.close()
        self.emu_log.close()
        if self._outcome_failed():
            for name in ("tandemd.log", "emu.log"):
                with open(os.path.join(self.dir, name)) as f:
                    sys.stderr.write(f"---- {name}\n{f.read()}")
        subprocess.run(["rm", "-rf", self.dir], check=False)

    def _outcome_failed(self):
        result = getattr(self, "_outcome", None)
        errors = getattr(result, "errors", None) or getattr(getattr(result, "result", None), "errors", [])
        return any(err for _, err in errors) if errors else False

    def wait_for(self, cond, what, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(0.05)
        self.fail(f"timed out waiting for {what}")

    def emu_connected(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                return json.load(r).get("connected") is True
        except OSError:
            return False

    def ctl(self, *args):
        out = subprocess.run([CTL, "--runtime-dir", self.dir, "--json", *args], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout) if out.stdout.strip() else None

    def complete(self, prompt, session):
        body = json.dumps({"prompt": prompt, "max_tokens": 2, "session_id": session}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)

    def drain(self):
        """Every message received so far, decoded: (topic, seq, [event])."""
        while True:
            try:
                parts = self.sub.recv_multipart()
            except zmq.Again:
                return
            self.assertEqual(len(parts), 3, "multipart [topic, seq, payload]")
            topic, seq, payload = parts
            self.assertEqual(len(seq), 8)
            batch = msgpack.unpackb(payload, raw=False)
            self.assertIsInstance(batch, list)
            self.assertEqual(len(batch), 2, "KVEventBatch [ts, events]")
            self.assertIsInstance(batch[0], float)
            self.assertLess(abs(batch[0] - time.time()), 60, "ts is Unix time")
            self.messages.append((topic.decode(), int.from_bytes(seq, "big"), batch[1]))

    def events_until(self, cond, what):
        def ready():
            self.drain()
            return cond([e for _, _, events in self.messages for e in events])

        self.wait_for(ready, what)
        return [e for _, _, events in self.messages for e in events]

    def test_stored_on_prefill_then_extended_then_removed_on_drop(self):
        # 100 tokens: 6 full blocks of 16.
        p1 = "a" * 400
        self.complete(p1, "kv-s1")
        events = self.events_until(lambda ev: sum(len(e[1]) for e in ev if e[0] == "BlockStored") >= 6,
                                   "BlockStored of the first prefill")
        stored = [e for e in events if e[0] == "BlockStored"]
        first = [h for e in stored for h in e[1]]
        self.assertEqual(len(first), 6, stored)
        self.assertEqual(len(set(first)), 6, "every block has its own hash")
        for e in stored:
            self.assertEqual(len(e), 8, "[tag, hashes, parent, token_ids, block_size, lora_id, medium, lora_name]")
            self.assertEqual(e[3], [], "token_ids are not carried")
            self.assertEqual(e[4], BLOCK)
            self.assertIsNone(e[5])
            self.assertEqual(e[6], "GPU")
        self.assertIsNone(stored[0][2], "the first block has no parent")
        chain = []
        for e in stored:
            if chain:
                self.assertEqual(e[2], chain[-1], "each event continues the chain")
            chain.extend(e[1])

        # The next round extends the context: only the new full blocks are stored.
        p2 = p1 + "c" * 200  # 150 tokens: blocks 6..8 are new
        reply = self.complete(p2, "kv-s1")
        self.assertGreater(reply["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        events = self.events_until(lambda ev: sum(len(e[1]) for e in ev if e[0] == "BlockStored") >= 9,
                                   "BlockStored of the second round")
        stored2 = [e for e in events if e[0] == "BlockStored"][len(stored):]
        added = [h for e in stored2 for h in e[1]]
        self.assertEqual(len(added), 3, stored2)
        self.assertEqual(stored2[0][2], first[-1], "the new blocks follow the first round's last")
        self.assertTrue(all(e[6] == "GPU" for e in stored2))

        # DROP (an operator's evict) removes every stored block from the device.
        self.ctl("session", "evict", "kv-s1")
        all_hashes = set(first + added)
        events = self.events_until(
            lambda ev: {h for e in ev if e[0] == "BlockRemoved" for h in e[1]} >= all_hashes, "BlockRemoved on drop"
        )
        removed = [e for e in events if e[0] == "BlockRemoved"]
        for e in removed:
            self.assertEqual(len(e), 3, "[tag, hashes, medium]")
            self.assertEqual(e[2], "GPU")

        # The transport: one topic per engine, sequence numbers without gaps.
        self.assertTrue(all(t == "kv@node@emu-kv" for t, _, _ in self.messages), self.messages)
        self.assertEqual([s for _, s, _ in self.messages], list(range(len(self.messages))))
        status = self.ctl("status")
        self.assertEqual(status["kv_events"]["endpoint"], "bind " + self.endpoint)
        self.assertGreaterEqual(status["kv_events"]["published"], len(events))
        self.assertEqual(status["kv_events"]["dropped"], 0)


class KvEventsOffloadTest(KvEventsTest):
    """A pool of 64 blocks and three sessions of 37: the policy offloads the
    idle ones to host memory to admit the next, and a session's next round
    reloads its copy."""

    EMU_ARGS = ["--kv-blocks", "64"]

    test_stored_on_prefill_then_extended_then_removed_on_drop = None  # the base class's, on the default pool only

    def hashes(self, events, tag, medium):
        return {h for e in events if e[0] == tag and e[-2 if tag == "BlockStored" else 2] == medium for h in e[1]}

    def test_offload_moves_blocks_to_cpu_and_a_reload_moves_them_back(self):
        self.complete("a" * 2400, "kv-a")  # 600 tokens: 37 full blocks
        events = self.events_until(lambda ev: len(self.hashes(ev, "BlockStored", "GPU")) >= 37, "A's blocks")
        a = self.hashes(events, "BlockStored", "GPU")
        self.assertEqual(len(a), 37)
        self.complete("b" * 2400, "kv-b")
        self.complete("c" * 2400, "kv-c")
        # A, idle in its tool call, went to host memory to make room.
        events = self.events_until(
            lambda ev: a <= self.hashes(ev, "BlockRemoved", "GPU") and a <= self.hashes(ev, "BlockStored", "CPU"),
            "A's blocks moved from GPU to CPU (offload)",
        )
        n_offloaded = len(events)
        # A's next round reloads its copy: back from CPU to GPU.
        reply = self.complete("a" * 2400 + "z" * 100, "kv-a")
        self.assertGreaterEqual(reply["usage"]["prompt_tokens_details"]["cached_tokens"], 37 * BLOCK)
        events = self.events_until(
            lambda ev: a <= self.hashes(ev[n_offloaded:], "BlockRemoved", "CPU")
            and a <= self.hashes(ev[n_offloaded:], "BlockStored", "GPU"),
            "A's blocks moved back from CPU to GPU (reload)",
        )
        self.assertEqual([s for _, s, _ in self.messages], list(range(len(self.messages))))


class KvEventsBindFailureTest(KvEventsTest):
    """A socket tandemd cannot bind costs the events, not the daemon or the
    engine; a bad endpoint is a configuration error."""

    ENDPOINT = "tcp://no-such-host.invalid:5557"
    test_stored_on_prefill_then_extended_then_removed_on_drop = None

    def test_unbindable_endpoint_is_off_with_why_and_events_count_as_dropped(self):
        reply = self.complete("a" * 400, "kv-f")
        self.assertEqual(reply["usage"]["prompt_tokens"], 100)
        self.assertIsNone(self.procs[0].poll(), "tandemd is still running")

        def dropped():
            status = self.ctl("status")
            return status["kv_events"]["dropped"] > 0 and status

        self.wait_for(dropped, "the events counted as dropped")
        status = self.ctl("status")
        self.assertTrue(status["kv_events"]["endpoint"].startswith("off: bind " + self.ENDPOINT),
                        status["kv_events"])
        self.assertEqual(status["kv_events"]["published"], 0)

        bad = os.path.join(self.dir, "bad.toml")
        with open(bad, "w") as f:
            f.write('[kv_events]\nendpoint = "udp://host:1"\n')
        out = subprocess.run([TANDEMD, "--config", bad, "--check-config"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 1)
        self.assertIn("kv_events.endpoint: 'udp://host:1'", out.stderr)


@unittest.skipUnless(LLAMA and MODEL, "no tandem-llama and model given")
class KvEventsLlamaTest(KvEventsTest):
    """tandem-llama's blocks: real token ids, so the counts are the
    tokenizer's; the chain, the medium and the removal on drop are checked."""

    test_stored_on_prefill_then_extended_then_removed_on_drop = None

    def engine_command(self):
        return [LLAMA, "--model", MODEL, "--port", str(self.port), "--runtime-dir", self.dir, "--name", "emu-kv",
                "--ctx", "2048", "--kv-events", "on"]

    def test_real_tokens_stored_then_removed_on_drop(self):
        self.complete("the quick brown fox jumps over the lazy dog " * 12, "kv-l")
        events = self.events_until(lambda ev: any(e[0] == "BlockStored" for e in ev), "BlockStored")
        stored = [h for e in events if e[0] == "BlockStored" for h in e[1]]
        self.assertGreaterEqual(len(stored), 2)
        self.assertTrue(all(e[4] == BLOCK and e[6] == "GPU" for e in events if e[0] == "BlockStored"))
        self.ctl("session", "evict", "kv-l")
        self.events_until(
            lambda ev: set(stored) <= {h for e in ev if e[0] == "BlockRemoved" and e[2] == "GPU" for h in e[1]},
            "BlockRemoved on drop",
        )
        self.assertTrue(all(t == "kv@node@emu-kv" for t, _, _ in self.messages))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
