"""The operator's environment settings: a bad value stops the app at start-up with one `error:` line, exit 2."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from demo_core import DemoInputError, Limits
from demo_core.config import env_number
from serving import operator_settings, planner_page, runs, uploads

ROOT = Path(__file__).resolve().parents[1]


def test_a_numeric_setting_is_a_positive_number_or_unset(monkeypatch):
    monkeypatch.delenv("PACKING_LAB_TEST_NUMBER", raising=False)
    assert env_number("PACKING_LAB_TEST_NUMBER", 7, whole=True) == 7
    for raw, whole, expected in ((" 12 ", True, 12), ("", True, 7), ("2.5", False, 2.5), ("90", False, 90.0)):
        monkeypatch.setenv("PACKING_LAB_TEST_NUMBER", raw)
        assert env_number("PACKING_LAB_TEST_NUMBER", 7, whole=whole) == expected
    for raw, whole in (("1.5", True), ("lots", True), ("0", True), ("-3", True), ("nan", False), ("inf", False),
                       ("0", False), ("12s", False)):
        monkeypatch.setenv("PACKING_LAB_TEST_NUMBER", raw)
        kind = "a whole number" if whole else "a number"
        with pytest.raises(DemoInputError, match=f"^PACKING_LAB_TEST_NUMBER must be {kind} above 0, got {raw!r}$"):
            env_number("PACKING_LAB_TEST_NUMBER", 7, whole=whole)


@pytest.mark.parametrize("name, value", [("PACKING_LAB_MAX_SAMPLES", "lots"), (runs.MAX_RUN_ENV, "two minutes"),
                                         (uploads.MAX_AGE_ENV, "-1"), (planner_page.WARM_UP_ENV, "some")])
def test_each_setting_is_checked_before_the_server_starts(monkeypatch, capsys, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as stopped:
        operator_settings.checked_limits()
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {name} must be ") and repr(value.strip()) in lines[0]


def test_good_settings_give_the_limits(monkeypatch):
    monkeypatch.setenv("PACKING_LAB_MAX_STEPS", "40")
    monkeypatch.setenv(runs.MAX_RUN_ENV, "90.5")
    assert operator_settings.checked_limits() == Limits(max_steps=40)
    assert runs.run_time_cap_s() == 90.5


def test_python_app_py_with_a_bad_setting_prints_one_error_line_and_exits_2():
    env = {**os.environ, "PACKING_LAB_MAX_RUN_S": "abc"}
    done = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == [
        "error: PACKING_LAB_MAX_RUN_S must be a number above 0, got 'abc'"]
