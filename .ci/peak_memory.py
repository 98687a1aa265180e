"""Peak resident memory of a process and everything it starts, sampled from /proc until SIGTERM, then printed.

`.ci/run` starts it on itself (`python3 .ci/peak_memory.py $$ &`) and stops it when it ends, pass or fail, so every CI
log ends with the suite's peak (pytest and the processes it starts: CLI runs, the served app, torchrun, Chromium).
Two numbers: the largest sum of the tree's resident sizes seen at one sample (shared pages count once per process,
so it errs high), and the largest single process by the kernel's own high-water mark (VmHWM, exact, not sampled).

Standard library only (it starts before pip installs anything); Linux only (it reads /proc): elsewhere it says so.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

SAMPLE_EVERY_S = 0.25
GIB = 2**30
PROC = Path("/proc")


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ")"
        parent = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    return children


def _tree(root: int) -> list[int]:
    children, tree, stack = _children_by_parent(), [], [root]
    while stack:
        pid = stack.pop()
        tree.append(pid)
        stack.extend(children.get(pid, []))
    return tree


def _status_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM in KiB ({} once the process has ended, or for a kernel thread)."""
    try:
        lines = (PROC / str(pid) / "status").read_text().splitlines()
    except OSError:
        return {}
    return {line.split(":")[0]: int(line.split()[1]) for line in lines if line.startswith(("VmRSS:", "VmHWM:"))}


def _command(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def main(root: int) -> None:
    if not PROC.is_dir():
        print("peak resident memory: not measured (no /proc on this system)", flush=True)
        return
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    me = os.getpid()
    peak_tree_kib, largest_kib, largest_command = 0, 0, ""
    while not stopped:
        tree_kib = 0
        for pid in _tree(root):
            if pid == me:
                continue
            status = _status_kib(pid)
            tree_kib += status.get("VmRSS", 0)
            if status.get("VmHWM", 0) > largest_kib:
                largest_kib, largest_command = status["VmHWM"], _command(pid)
        peak_tree_kib = max(peak_tree_kib, tree_kib)
        time.sleep(SAMPLE_EVERY_S)
    print(f"peak resident memory: {peak_tree_kib * 1024 / GIB:.2f} GiB (this CI run's processes together, sampled "
          f"every {SAMPLE_EVERY_S} s); largest single process: {largest_kib * 1024 / GIB:.2f} GiB "
          f"({largest_command[:80]})", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
