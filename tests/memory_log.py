"""Where the suite's memory goes, per test: with PACKING_LAB_MEMORY_LOG=<file>, after every test (its fixtures' teardown
included) one tab-separated line: the test's id, this process's resident MiB, its peak resident MiB since its test file
began, and the resident MiB of its live child processes. The terminal summary then lists each file's peak.

Off unless asked: it is how a step up in memory is traced to a test file and a test (`.ci/run` prints only the whole
suite's peak). Linux only (it reads /proc); elsewhere the variable is ignored.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import psutil
import pytest

LOG_ENV = "PACKING_LAB_MEMORY_LOG"
MIB = 2**20
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _peak_resident_bytes() -> int:
    """This process's resident high-water mark (VmHWM) since it began or since `_reset_peak`."""
    return int(re.search(r"VmHWM:\s+(\d+) kB", _STATUS.read_text()).group(1)) * 1024


def _reset_peak() -> None:
    """Lowers the high-water mark to the current resident size (Linux >= 4.0: proc(5), /proc/pid/clear_refs, "5")."""
    _CLEAR_REFS.write_text("5")


class MemoryLog:
    def __init__(self, path: Path):
        self.path = path
        self.process = psutil.Process()
        self.file_peaks: dict[str, int] = {}
        self.current_file: str | None = None
        path.write_text("test\trss_mib\tfile_peak_mib\tchildren_rss_mib\n")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item):
        test_file = item.nodeid.split("::")[0]
        if test_file != self.current_file:
            self.current_file = test_file
            _reset_peak()
        yield
        children_bytes = 0
        for child in self.process.children(recursive=True):
            try:
                children_bytes += child.memory_info().rss
            except psutil.Error:  # it ended while we looked
                pass
        peak = _peak_resident_bytes()
        self.file_peaks[test_file] = max(self.file_peaks.get(test_file, 0), peak)
        with self.path.open("a") as log:
            log.write(f"{item.nodeid}\t{self.process.memory_info().rss / MIB:.0f}\t{peak / MIB:.0f}"
                      f"\t{children_bytes / MIB:.0f}\n")

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.section("peak resident memory per test file (MiB, this process)")
        for test_file, peak in self.file_peaks.items():
            terminalreporter.write_line(f"{peak / MIB:8.0f}  {test_file}")


def pytest_configure(config):
    path = os.environ.get(LOG_ENV)
    if path and _STATUS.exists():
        config.pluginmanager.register(MemoryLog(Path(path)), "packing-lab-memory-log")
