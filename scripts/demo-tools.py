#!/usr/bin/env python3
"""The tour's host-plane part (scripts/tour): a runner starts tool calls
through libtandem (the Python binding) against a running tandemd, and shows
what the host plane does with them. Usage: demo-tools.py RUNTIME_DIR TANDEMCTL.

1. Three tools of one session run in their cgroups; `tandemctl tools` lists
   them; one of them daemonises a grandchild, which closing the session kills.
2. A burner with memory_high = 64 MiB is held there, not killed; one with
   memory_max = 64 MiB is OOM-killed and reported as such.
"""
import os
import subprocess
import sys
import time

import tandem

run_dir, tandemctl = sys.argv[1], sys.argv[2]


def ctl(*args):
    out = subprocess.run([tandemctl, "--runtime-dir", run_dir, *args], capture_output=True, text=True)
    sys.stdout.write(out.stdout or out.stderr)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


r = tandem.Runner(runtime_dir=run_dir, name="demo-runner")
for _ in range(200):
    r.poll(10)
    if r.connected:
        break
s = r.session_open("demo-agent")


def spawn(*args, **kw):
    # As root every tool gets its cgroup, or does not start; run without
    # root, tandemd has no cgroups, and the tour asks for tools to run
    # unplaced rather than not at all.
    return r.tool_spawn(*args, allow_unplaced=os.geteuid() != 0, **kw)


print("-- three tool calls of session demo-agent, each in its own cgroup:")
sleeper = spawn(s, "sleep", ["sleep", "30"])
burner = spawn(s, "burn", ["sh", "-c", "while :; do :; done"], cpu_quota_us=20000)  # a fifth of a core
read_fd, write_fd = os.pipe()
daemoniser = spawn(s, "daemonise", ["sh", "-c", "setsid sleep 300 & echo $!"], stdout=write_fd)
os.close(write_fd)
grandchild = int(os.read(read_fd, 64).decode().strip())
os.close(read_fd)
print(f"   pids {sleeper}, {burner} (cpu.max 20 ms / 100 ms), {daemoniser} (left grandchild {grandchild} behind)")
with open(f"/proc/{sleeper}/cgroup") as f:
    print("   /proc/%d/cgroup:" % sleeper)
    for line in f:
        if "tools/" in line:
            print("     " + line.rstrip())
time.sleep(1.0)
ctl("tools")
res = r.tool_wait(daemoniser)
print(f"-- the daemoniser exited {res.exit_code}; its grandchild is {'alive' if alive(grandchild) else 'gone'}")
r.tool_kill(burner)
res = r.tool_wait(burner)
print(f"-- burner killed: {res.cpu_ns / 1e9:.2f} s of CPU in {res.wall_ns / 1e9:.2f} s of wall (cpu.max held it to ~20 %)")
r.session_close(s)
for _ in range(100):
    if not alive(grandchild):
        break
    time.sleep(0.02)
print(f"-- session closed: the grandchild {grandchild} is {'alive (LEAK)' if alive(grandchild) else 'gone'}, "
      f"found by cgroup membership")

print("-- memory: a 512 MiB burner with memory_high = 64 MiB, then with memory_max = 64 MiB")
s = r.session_open("demo-memory")
burn = ["python3", "-c", "import time\nb=[]\nfor i in range(32):\n b.append(bytearray(16<<20))\nprint('done')"]
devnull = open(os.devnull, "w")
held = spawn(s, "burn-mem", burn, memory_high=64 << 20, stdout=devnull)
time.sleep(2.0)
try:
    r.tool_wait(held, 0)
    print("   memory_high: the burner finished (not throttled?)")
except TimeoutError:
    print("   memory_high: after 2 s the burner is still running, held at its limit, not killed")
ctl("tools")
r.tool_kill(held)
r.tool_wait(held)
oom = spawn(s, "burn-mem", burn, memory_max=64 << 20, stdout=devnull)
res = r.tool_wait(oom)
print(f"   memory_max: exit {res.exit_code}, reason {res.reason.name}: {res.message}")
r.session_close(s)
r.close()
