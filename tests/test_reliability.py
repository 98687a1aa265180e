"""Reliability and security of the app as it is served: load, a killed server, and what the web may reach.

- Load: five clients at once against the in-process server (the `lab_app` fixture): the training queue runs one job
  at a time, every client gets its own config back, and waiting clients see their queue position.
- Kill and restart: `python app.py` as a real subprocess, SIGKILLed in the middle of a run, its history file then
  torn by hand; the restarted server still has the completed run, skips the torn line with a warning and saves new
  runs. The same subprocess (started with PACKING_LAB_MAX_* caps) shows the caps enforced through the API and the
  loopback-only bind.
- Security: no model code is ever executed (auto_map), paths outside the allowed roots are refused, and error
  messages about a bad file never carry its content.

Every run is tiny (16-24 samples, 2 steps, batch 4) so the file takes about a minute on 2 cores.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from gradio_client import Client, handle_file
from gradio_client.utils import Status

import demo_core
from demo_core.models.sources import PRESETS, byte_tokenizer

REPO = Path(__file__).resolve().parents[1]
TINY = dict(collators="padded,flatten", steps=2, batch_size=4)
SECRET = "sk-live-51HXDEADBEEF0123456789"  # a secret-looking string that must never come back in a message


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def api_error(client: Client, endpoint: str, **arguments) -> str:
    with pytest.raises(Exception) as raised:
        client.predict(**arguments, api_name=endpoint)
    return str(raised.value)


# ----------------------------------------------------------------------------------------------------------------
# Load: one training job at a time, five clients at once
# ----------------------------------------------------------------------------------------------------------------


def test_training_endpoints_share_one_queue_slot(lab_app):
    functions = {fn.api_name: fn for fn in lab_app.demo.fns.values()}
    assert functions["compare"].concurrency_id == functions["run_page"].concurrency_id == "training"
    queue = lab_app.demo._queue  # gradio resolves "default" to the queue's default, and a group takes its lowest limit
    limits = {queue.default_concurrency_limit if fn.concurrency_limit == "default" else fn.concurrency_limit
              for fn in functions.values() if fn.concurrency_id == "training"}
    assert limits == {1}
    assert functions["preview"].concurrency_id != "training"  # previews never wait behind a training job


def test_five_clients_at_once_each_get_their_own_run_one_at_a_time(lab_app, monkeypatch):
    # Observe when each run really trains: the real engine, timed (the app calls demo_core.run_comparison).
    real_run_comparison, spans = demo_core.run_comparison, []

    def timed_run_comparison(prepared, **kwargs):
        start = time.monotonic()
        try:
            return real_run_comparison(prepared, **kwargs)
        finally:
            spans.append((prepared.config.seed, start, time.monotonic()))

    monkeypatch.setattr(demo_core, "run_comparison", timed_run_comparison)
    sent = [dict(TINY, samples=16 + i, seed=100 + i) for i in range(5)]  # every client a different config
    clients = [Client(lab_app.demo.local_url, verbose=False) for _ in sent]  # five sessions
    submitted = time.monotonic()
    jobs = [client.submit(**arguments, api_name="/compare") for client, arguments in zip(clients, sent)]
    seen: list[set] = [set() for _ in jobs]  # (code, rank, queue_size) each job reported while it ran
    deadline = submitted + 540
    while not all(job.done() for job in jobs) and time.monotonic() < deadline:
        for job, statuses in zip(jobs, seen):
            status = job.status()
            statuses.add((status.code, status.rank, status.queue_size))
        time.sleep(0.02)
    documents = [job.result(timeout=60) for job in jobs]
    elapsed = time.monotonic() - submitted

    for arguments, document in zip(sent, documents):  # no cross-talk: each result is the config its client sent
        config = document["config"]
        assert (config["seed"], config["samples"]) == (arguments["seed"], arguments["samples"])
        assert document["dataset_stats"]["count"] == arguments["samples"]
        assert [result["collator"] for result in document["results"]] == ["padded", "flatten"]
    spans.sort(key=lambda span: span[1])
    assert sorted(seed for seed, _, _ in spans) == [arguments["seed"] for arguments in sent]
    for (_, _, previous_end), (_, start, _) in zip(spans, spans[1:]):
        assert start >= previous_end, f"two training runs overlapped: {spans}"
    # Queue position: the clients that waited were told where they stood.
    queued = [sorted({(rank, size) for code, rank, size in statuses if code == Status.IN_QUEUE and rank is not None})
              for statuses in seen]
    assert sum(1 for positions in queued if positions) >= 3, queued
    assert max(rank for positions in queued for rank, _ in positions) >= 2, queued
    assert lab_app.demo._queue.event_queue_per_concurrency_id["training"].concurrency_limit == 1  # as it ran
    history = {entry.document["config"]["seed"]: entry.document for entry in lab_app.HISTORY.entries()}
    for arguments, document in zip(sent, documents):
        assert history[arguments["seed"]]["results"] == document["results"]
    print(f"\nload: 5 clients in {elapsed:.1f} s; runs "
          f"{', '.join(f'{end - start:.1f}' for _, start, end in spans)} s; queue (rank, size) seen {queued}")


# ----------------------------------------------------------------------------------------------------------------
# A real server process: caps from the environment, loopback bind, kill -9 mid-run and restart
# ----------------------------------------------------------------------------------------------------------------

CAPS = {"PACKING_LAB_MAX_SAMPLES": "64", "PACKING_LAB_MAX_STEPS": "400", "PACKING_LAB_MAX_LENGTH": "512",
        "PACKING_LAB_MAX_UPLOAD_BYTES": "200000"}


class ServerProcess:
    """`python app.py` in a subprocess, its output in a log file."""

    def __init__(self, data_dir: Path, log_path: Path):
        self.data_dir, self.log_path = data_dir, log_path
        self.process: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self, timeout_s: float = 180) -> "ServerProcess":
        self.port = free_port()
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("PACKING_LAB_", "GRADIO_"))}  # nothing inherited may move the bind or caps
        # The planner's warm-up of its opening questions only: its LoRA phase (about 190 CPU seconds, docs/MEMORY.md)
        # would compete with the suite's other tests for nothing these tests look at.
        env.update(CAPS, PACKING_LAB_DATA_DIR=str(self.data_dir), GRADIO_SERVER_PORT=str(self.port),
                   PACKING_LAB_PLANNER_WARMUP="opening", HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False",
                   PYTHONUNBUFFERED="1")
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen([sys.executable, "app.py"], cwd=REPO, env=env, stdout=log,
                                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"the server did not answer within {timeout_s} s:\n{self.log()}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self) -> Client:
        return Client(self.url, verbose=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("served-data")
    served = ServerProcess(data_dir, data_dir.parent / f"{data_dir.name}-server.log").start()
    yield served
    served.kill()


def test_server_binds_loopback_only(server):
    listening = [c for c in psutil.Process(server.process.pid).net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    assert listening, "the server process listens on nothing"
    assert {(c.laddr.ip, c.laddr.port) for c in listening} == {("127.0.0.1", server.port)}


def test_launch_binds_loopback_unless_told_otherwise(lab_app, monkeypatch):
    calls = []
    monkeypatch.setattr(lab_app.demo, "launch", lambda **options: calls.append(options))  # the bind is the boundary
    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    lab_app.launch()
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    lab_app.launch()
    assert [(c["server_name"], c["share"]) for c in calls] == [("127.0.0.1", False), ("0.0.0.0", False)]


def test_caps_from_the_environment_are_enforced_through_the_api(server):
    client = server.client()
    for arguments, message in ((dict(samples=65), "samples must be between 1 and 64, got 65"),
                               (dict(steps=401), "steps must be between 1 and 400, got 401"),
                               (dict(max_length=513), "max length must be between 2 and 512, got 513")):
        assert message in api_error(client, "/preview", **arguments)
    # The defaults are lowered to the caps, so a call with no arguments is still a valid run.
    config = client.predict(api_name="/preview")["config"]
    assert (config["samples"], config["max_length"]) == (64, 512)
    # A file in an allowed folder but over the upload cap is refused before it is read.
    big = server.data_dir / "big.jsonl"
    big.write_text("\n".join(json.dumps({"text": f"{SECRET} {i:07d}"}) for i in range(10_000)))
    message = api_error(client, "/preview", dataset=str(big))
    assert "the limit is 0.2 MB" in message and SECRET not in message
    # The API's file parameter has the page's cap: the client refuses to send it, as the page's upload box does.
    with pytest.raises(ValueError, match="exceeds the maximum file size of 200000 bytes"):
        client.predict(dataset_file=handle_file(str(big)), api_name="/preview")
    # Gradio's own upload route applies the same cap (413), and takes a file under it.
    route = f"{server.url}gradio_api/upload"
    too_big = httpx.post(route, files={"files": ("big.jsonl", big.read_bytes())}, timeout=60)
    assert too_big.status_code == 413, too_big.text
    small = httpx.post(route, files={"files": ("small.jsonl", b'{"text": "hello there"}\n')}, timeout=60)
    assert small.status_code == 200, small.text


def test_killed_mid_run_the_restarted_server_keeps_history_and_skips_the_torn_line(server):
    history_file = server.data_dir / "history.jsonl"
    client = server.client()
    first = client.predict(**TINY, samples=16, seed=7, api_name="/compare")
    runs = client.predict(api_name="/history")
    assert [run["seed"] for run in runs][-1] == 7
    kept = [run["run_id"] for run in runs]
    lines_before = history_file.read_bytes().count(b"\n")

    long_run = client.submit(collators="padded,flatten", samples=64, steps=400, batch_size=4, seed=8,
                             api_name="/compare")
    deadline = time.monotonic() + 120
    while long_run.status().code != Status.PROCESSING and time.monotonic() < deadline:
        time.sleep(0.05)
    assert long_run.status().code == Status.PROCESSING
    time.sleep(1.0)  # well inside the 2 x 400 steps
    server.kill()  # SIGKILL: no handler, no flush, no cleanup
    assert server.process.returncode == -signal.SIGKILL
    assert history_file.read_bytes().count(b"\n") == lines_before  # the killed run left nothing behind
    with history_file.open("ab") as handle:  # and a write cut short by the crash
        handle.write(b'{"run_id":"torn0000","saved_at":"2026-01-01T00:00:00+00:00","document":{"config":{"se')

    server.start()
    client = server.client()
    runs = client.predict(api_name="/history")
    assert [run["run_id"] for run in runs] == kept  # every completed run survived; the torn line is not one
    assert runs[-1]["seed"] == 7 and runs[-1]["samples"] == first["config"]["samples"]
    torn_line = lines_before + 1
    assert re.search(rf"WARNING.*skipping unreadable line {torn_line} of .*history\.jsonl", server.log()), server.log()
    assert "Traceback" not in server.log()
    after = client.predict(**TINY, samples=17, seed=9, api_name="/compare")
    assert after["config"]["seed"] == 9
    runs = client.predict(api_name="/history")
    assert [run["run_id"] for run in runs][:-1] == kept and runs[-1]["seed"] == 9  # appended after the torn line
    assert b'"se\n{' in history_file.read_bytes()  # the fragment stays on a line of its own


# ----------------------------------------------------------------------------------------------------------------
# Security: no model code runs, no path outside the allowed roots, no file content in messages
# ----------------------------------------------------------------------------------------------------------------


def test_trust_remote_code_is_never_true_in_the_source():
    # The app, the benchmarks and every package of the repository (demo_core, serving, presentation, ...).
    packages = [folder for folder in REPO.iterdir() if (folder / "__init__.py").exists()]
    sources = [REPO / "app.py", *sorted((REPO / "benchmarks").glob("*.py")),
               *sorted(path for package in packages for path in package.rglob("*.py"))]
    assert {"demo_core", "serving", "presentation"} <= {package.name for package in packages}
    uses = [(path.name, match.group(0)) for path in sources
            for match in re.finditer(r"trust_remote_code\s*=\s*[^,)\s]+", path.read_text())]
    assert uses, "the loader should pass trust_remote_code explicitly"
    assert {value for _, value in uses} == {"trust_remote_code=False"}, uses


def model_folder_with_custom_code(folder: Path, model_type: str, marker: Path) -> Path:
    """A tiny Llama checkpoint whose config and tokenizer point (auto_map) at a module that writes `marker`."""
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_config(PRESETS["tiny-llama"].config()).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type=model_type, auto_map={"AutoConfig": "custom_code.CustomConfig",
                                                   "AutoModelForCausalLM": "custom_code.CustomModel"})
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer["auto_map"] = {"AutoTokenizer": ["custom_code.CustomTokenizer", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    (folder / "custom_code.py").write_text(f"""
from pathlib import Path
Path({str(marker)!r}).write_text("model code was executed")
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizer
class CustomConfig(LlamaConfig):
    model_type = {model_type!r}
class CustomModel(LlamaForCausalLM):
    config_class = CustomConfig
class CustomTokenizer(PreTrainedTokenizer):
    pass
""")
    return folder


def test_model_code_in_a_checkpoint_is_never_executed(lab_app, tmp_path):
    data_dir = lab_app.HISTORY.path.parent  # an allowed root
    marker = tmp_path / "custom-code-ran"
    known = model_folder_with_custom_code(data_dir / "auto-map-llama", "llama", marker)
    unknown = model_folder_with_custom_code(data_dir / "auto-map-custom", "packing-lab-custom", marker)
    client = Client(lab_app.demo.local_url, verbose=False)
    # A known architecture loads as the standard transformers class; its auto_map is ignored.
    document = client.predict(**TINY, model=str(known), samples=16, api_name="/compare")
    assert [result["steps"] for result in document["results"]] == [2, 2]
    # An architecture only the custom code defines is refused with a clear message.
    message = api_error(client, "/preview", model=str(unknown), samples=16)
    assert "needs its own Python code" in message and "never runs" in message
    assert not marker.exists()
    # The check can fail: trusting the folder does run its code (in a child, with a throwaway modules cache).
    subprocess.run([sys.executable, "-c", "import sys; from transformers import AutoConfig; "
                    "AutoConfig.from_pretrained(sys.argv[1], trust_remote_code=True)", str(unknown)],
                   env={**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"},
                   check=True, capture_output=True, timeout=300)
    assert marker.exists()


@pytest.mark.parametrize("endpoint", ["/preview", "/compare"])
@pytest.mark.parametrize("field, value", [("dataset", "/etc/passwd"), ("model", "/"), ("model", "/etc"),
                                          ("dataset", "/proc/self/environ.json"), ("dataset", "../../../../../../../../etc/passwd")])
def test_paths_outside_the_allowed_roots_are_refused(lab_app, endpoint, field, value, monkeypatch):
    monkeypatch.chdir(lab_app.HISTORY.path.parent)  # relative paths climb out of the data dir
    client = Client(lab_app.demo.local_url, verbose=False)
    message = api_error(client, endpoint, **TINY, samples=16, **{field: value})
    assert "outside the folders this app may read" in message
    assert "root:" not in message and "PATH=" not in message and "Traceback" not in message


def test_a_symlink_inside_an_allowed_root_cannot_point_outside(lab_app):
    link = lab_app.HISTORY.path.parent / "passwd.jsonl"
    link.unlink(missing_ok=True)
    link.symlink_to("/etc/passwd")
    message = api_error(Client(lab_app.demo.local_url, verbose=False), "/preview", dataset=str(link), samples=16)
    assert "outside the folders this app may read" in message and "root:" not in message


@pytest.mark.parametrize("name, content, expected", [
    ("bad.json", f'[{{"text": "fine"}}, {{"text": "{SECRET}",, }}]', "bad.json line 1: not valid JSON"),
    ("no-text.jsonl", f'{{"api_key": "{SECRET}"}}\n', "no usable text"),
    ("messages.jsonl", f'{{"messages": [{{"speaker": "{SECRET}"}}]}}\n', "message 1 has no role"),
    ("binary.jsonl", SECRET.encode() + bytes(range(128, 256)), "not UTF-8 text"),
])
def test_a_malformed_file_error_never_echoes_its_content(lab_app, name, content, expected):
    path = lab_app.HISTORY.path.parent / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    message = api_error(Client(lab_app.demo.local_url, verbose=False), "/preview", dataset=str(path), samples=16)
    assert expected in message
    assert SECRET not in message and SECRET[:12] not in message


def test_a_skipped_lines_note_never_echoes_its_content(lab_app):
    # A JSON Lines file with a line that does not parse still trains on the others (readers.py): the note that names
    # the skipped line says why, never what the line held.
    path = lab_app.HISTORY.path.parent / "bad-line.jsonl"
    path.write_text(f'{{"text": "fine"}}\n{{"text": "{SECRET}" oops}}\n')
    preview = Client(lab_app.demo.local_url, verbose=False).predict(dataset=str(path), samples=16,
                                                                   api_name="/preview")
    notes = " ".join(preview["dataset_stats"]["notes"])
    assert "skipped 1 of 2 records" in notes and "line 2: not valid JSON" in notes, notes
    assert SECRET not in json.dumps(preview) and SECRET[:12] not in json.dumps(preview)


def test_a_malformed_model_config_error_never_echoes_its_content(lab_app):
    folder = lab_app.HISTORY.path.parent / "broken-model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(f'{{"model_type": "llama", "token": "{SECRET}",,}}')
    message = api_error(Client(lab_app.demo.local_url, verbose=False), "/preview", model=str(folder), samples=16)
    assert "cannot load model" in message
    assert SECRET not in message and SECRET[:12] not in message
