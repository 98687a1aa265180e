"""The page's training handler with its GPU part in a forked worker process, as on a ZeroGPU Space, on a CPU.

The installed `spaces` package does the work, through the production line `spaces.GPU(duration=...)(task)` in
`serving/gpu.py` (re-imported with ZeroGPU switched on): it forks the worker, pickles the arguments and every yielded
value across pipes, reuses the idle worker for the next call (its memory a stale copy of the server's), and turns a
dead worker into "GPU task aborted". Replaced are only what needs ZeroGPU's hardware: the scheduler's HTTP API
(schedule / allow / release) and the CUDA attach layer `spaces.zero.torch` (which cannot even be imported with a CPU
build of torch); the scheduler's kill when the granted duration runs out is a SIGKILL from a timer.

Runs are small (64 samples, batch 4); the time-budget test waits for its budget (about 20 s).
"""

import importlib
import multiprocessing
import os
import signal
import sys
import threading
import types
import uuid

import gradio as gr
import pytest
import spaces.config
from gradio_client import Client

import demo_core
from demo_core.training import engine
from serving import gpu, runs
from serving.history import RunHistory

# spaces reads the GPU model from the NVIDIA driver's files, which a CPU machine has not got (it then assumes an H200).
pytestmark = pytest.mark.filterwarnings("ignore:Error while reading infos from Nvidia driver FS:UserWarning")


class EmulatedZeroGPU:
    """ZeroGPU's scheduler as the `spaces` client sees it: grants every request and kills the worker at its end."""

    def __init__(self, monkeypatch):
        cuda_attach = types.ModuleType("spaces.zero.torch")  # a GPU worker attaches CUDA here; a CPU has none
        for name in ("unpatch", "init", "move", "enter_mode", "patch"):
            setattr(cuda_attach, name, lambda *args, **kwargs: None)
        cuda_attach.size = lambda: 0
        monkeypatch.setitem(sys.modules, "spaces.zero.torch", cuda_attach)
        from spaces.zero import client

        monkeypatch.setattr(client, "schedule", self.schedule)
        monkeypatch.setattr(client, "allow", lambda allow_token: None)
        monkeypatch.setattr(client, "release", self.release)
        monkeypatch.setattr(client, "duration_warning", lambda: None)
        self.requested_s: list[float] = []
        self.kills = 0
        self._timer: threading.Timer | None = None

    def schedule(self, task_id, request=None, duration=None, gpu_size=None, **_):
        from spaces.zero.api import ScheduleResponse

        self.requested_s.append(duration.total_seconds())
        self._timer = threading.Timer(duration.total_seconds(), self.kill_workers)
        self._timer.start()
        # idle=True: the next call reuses the worker forked for the first one, as ZeroGPU does.
        return ScheduleResponse(idle=True, nvidiaIndex=0, nvidiaUUID="cpu", allowToken=uuid.uuid4().hex)

    def release(self, allow_token, fail=False, allow_404=False):
        self._timer.cancel()

    @staticmethod
    def worker_pids() -> list[int]:
        return [child.pid for child in multiprocessing.active_children()]

    def kill_workers(self):
        for pid in self.worker_pids():
            os.kill(pid, signal.SIGKILL)
            self.kills += 1


@pytest.fixture
def zerogpu(monkeypatch, lab_app, tmp_path):
    """ZeroGPU switched on for `serving.gpu` (re-imported, so `train_on_gpu` is spaces' real wrapper); a history of
    this test's own, so that the measured step times the time plan reads are the ones the test gives it."""
    emulator = EmulatedZeroGPU(monkeypatch)
    monkeypatch.setattr(spaces.config.Config, "zero_gpu", True)
    # ZeroGPU trains on CUDA, where the collators' bursts run one after another (they alternate only on a CPU).
    monkeypatch.setattr(engine, "takes_turns", lambda device: False)
    importlib.reload(gpu)
    assert gpu.ON_ZEROGPU and hasattr(gpu.train_on_gpu, "zerogpu")  # spaces' wrapper (decorator.py marks it)
    monkeypatch.setattr(lab_app, "HISTORY", RunHistory(tmp_path))
    monkeypatch.setenv(runs.MAX_RUN_ENV, "900")  # room for 200-step runs that Stop or the budget cut short
    yield emulator
    emulator.kill_workers()  # the idle worker this test's wrapper kept: the next test's wrapper forks its own
    monkeypatch.undo()
    importlib.reload(gpu)


def page_run(lab_app, session: str, steps: int, on_progress=None, collators=("padded", "flatten"), samples=64):
    """The page's Run handler, driven like Gradio drives it; `on_progress(desc)` sees every progress report."""
    request = types.SimpleNamespace(session_hash=session)
    return request, lab_app.run_page(
        request, lambda fraction, desc="": on_progress and on_progress(desc), samples=samples,
        collators=list(collators), steps=steps, batch_size=4, precision="fp32")


def test_stop_reaches_the_forked_worker_and_the_server_saves_and_lists_the_partial_run(lab_app, zerogpu):
    seen_workers = []

    def on_progress(desc):
        if desc.startswith("padded 1/200"):  # training has started in the worker: click Stop in the server
            seen_workers.extend(zerogpu.worker_pids())
            assert lab_app.request_stop(request) == "Stopping after the current step…"

    request, run = page_run(lab_app, f"zerogpu-stop-{uuid.uuid4()}", 200, on_progress)
    *_, final = run
    assert seen_workers and os.getpid() not in seen_workers  # it trained in another process
    ui = lab_app.UI
    status, headline, history_rows = final[ui.bar.status], final[ui.views.summary], final[ui.views.history]
    assert headline.startswith("### Stopped") and zerogpu.kills == 0
    entry = lab_app.HISTORY.entries()[-1]
    assert entry.document["stop_reason"] == "stop" and entry.document["partial"]
    assert [result["steps"] for result in entry.document["results"]] in ([1], [2])  # ended after the current step
    assert entry.run_id in status and history_rows[0][0] == entry.run_id  # the server's table has it
    runs_seen_by_a_client = Client(lab_app.demo.local_url, verbose=False).predict(api_name="/history")
    assert runs_seen_by_a_client[-1]["run_id"] == entry.run_id and runs_seen_by_a_client[-1]["partial"]
    # The reused worker (forked before this run was saved) trains the next run; its history is the server's.
    request, run = page_run(lab_app, f"zerogpu-again-{uuid.uuid4()}", 2, collators=("padded",), samples=16)
    *_, final = run
    assert [row[0] for row in final[ui.views.history]][:2] == [lab_app.HISTORY.entries()[-1].run_id, entry.run_id]
    assert len(zerogpu.requested_s) == 2 and zerogpu.kills == 0


def test_a_run_stops_itself_inside_its_zerogpu_duration_and_keeps_what_it_has(lab_app, zerogpu, monkeypatch):
    # Earlier runs that measured tiny-llama 1000x faster than this machine is: the plan believes 200 steps fit.
    measured = demo_core.run_comparison(demo_core.RunConfig(samples=16, steps=3, batch_size=4, precision="fp32"))
    for _ in range(runs.duration.RECENT_RUNS):
        document = measured.to_dict()
        for result in document["results"]:
            result["step_times_s"] = [seconds / 1000 for seconds in result["step_times_s"]]
        lab_app.HISTORY.append(document)
    request, run = page_run(lab_app, f"zerogpu-budget-{uuid.uuid4()}", 200)
    *_, final = run  # the kill at the end of the granted duration would raise "GPU task aborted" here
    granted_s = zerogpu.requested_s[-1]
    budget_s = granted_s - runs.WORKER_START_S
    assert zerogpu.kills == 0 and 15 <= granted_s <= 60, zerogpu.requested_s
    entry = lab_app.HISTORY.entries()[-1]
    assert entry.document["stop_reason"] == "time budget" and entry.document["partial"]
    trained_s = sum(sum(result["step_times_s"]) for result in entry.document["results"])
    assert 0 < trained_s < budget_s and sum(result["steps"] for result in entry.document["results"]) < 400
    assert f"time budget ({budget_s:.0f} s)" in final[lab_app.UI.bar.status]
    assert final[lab_app.UI.views.history][0][0] == entry.run_id


def test_a_killed_worker_leaves_its_finished_collators_saved(lab_app, zerogpu):
    def on_progress(desc):
        if desc.endswith("flatten 1/3"):  # padded is done and handed back; the scheduler kills the worker now
            zerogpu.kill_workers()

    request, run = page_run(lab_app, f"zerogpu-kill-{uuid.uuid4()}", 3, on_progress)
    with pytest.raises(gr.Error, match="GPU task aborted"):
        list(run)
    assert zerogpu.kills == 1
    entry = lab_app.HISTORY.entries()[-1]
    assert entry.document["stop_reason"] == "error" and entry.document["partial"]
    assert [(result["collator"], result["steps"]) for result in entry.document["results"]] == [("padded", 3)]


def test_a_stop_while_waiting_for_the_gpu_ends_the_run_with_nothing_to_save(lab_app, zerogpu):
    def on_progress(desc):
        if desc == "building the model and the first batch":  # before the worker exists
            assert lab_app.request_stop(request) == "Stopping after the current step…"

    request, run = page_run(lab_app, f"zerogpu-early-{uuid.uuid4()}", 200, on_progress)
    *_, final = run
    assert final[lab_app.UI.bar.status] == "Stopped before the first step: nothing to save."
    assert not lab_app.HISTORY.entries()
    assert len(zerogpu.requested_s) == 1 and zerogpu.kills == 0


def test_a_run_predicted_past_the_cap_is_refused_with_the_steps_that_fit(lab_app, zerogpu, monkeypatch):
    monkeypatch.setenv(runs.MAX_RUN_ENV, "60")
    request, run = page_run(lab_app, f"zerogpu-refused-{uuid.uuid4()}", 1000)
    with pytest.raises(gr.Error) as refused:
        next(run)
    message = str(refused.value)
    assert "more than the 60 s a run may take here" in message and not zerogpu.requested_s
    fit = int(message.split("use at most ")[1].split(" steps")[0])
    run = dict(samples=64, batch_size=4, precision="fp32")  # page_run's
    prepared = lab_app.prepare_inputs(None, **run, steps=fit)
    job = runs.plan(prepared, lab_app.HISTORY, lab_app.LIMITS, "unused-marker", None)
    assert fit > 0 and job.gpu_duration_s <= 60  # the advice is a run the same plan accepts
    with pytest.raises(demo_core.DemoInputError):
        runs.plan(lab_app.prepare_inputs(None, **run, steps=fit + 1), lab_app.HISTORY, lab_app.LIMITS, "unused", None)


def test_the_time_plan_learns_from_timed_steps_only():
    # Step 1 (warm-up) and the profiled step 2 are slow on purpose; the rate comes from the steps throughput counts.
    from demo_core.training import duration

    result = {"step_times_s": [9.0, 5.0, 0.1, 0.1, 0.1], "step_padded_slots": [100] * 5, "profiled_step": 2}
    config = demo_core.prepare(demo_core.RunConfig(samples=16)).document_config()
    document = {"config": config, "results": [result]}
    here = duration.speed_key(config)
    assert duration.measured_seconds_per_slot([document], here) == pytest.approx(0.001)
    elsewhere = duration.speed_key({**config, "resolved_device": "cuda"})
    assert duration.measured_seconds_per_slot([document], elsewhere) is None  # other device
