"""Hub ids with the network as the boundary: no network fails in about a second with that reason, a hub that answers
tells a missing, gated or config-less repository apart, and the planner fetches any model's config.json alone.

The hub is a small HTTP server on 127.0.0.1 answering as the hub does (its X-Error-Code headers, a file's ETag and
commit); "no network" is a closed port and a port that accepts but never answers. Nothing leaves this machine.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import huggingface_hub
import pytest
import torch
from huggingface_hub import constants
from transformers import AutoModelForCausalLM, LlamaConfig

from demo_core import DemoInputError, RunConfig, preview
from demo_core.memory.plan_request import PlanRequest, load_config
from demo_core.memory.planner import plan
from demo_core.models.hub import HUB_CHECK_TIMEOUT_S, offline_reason
from demo_core.models.sources import load_model_source

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TINY_CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
               "max_position_embeddings": 512}
# repository -> (status, X-Error-Code) of its config.json; a repository not listed has TINY_CONFIG
ERRORS = {"missing-org/missing-model": (404, "RepoNotFound"), "some-org/gated-model": (403, "GatedRepo"),
          "some-org/dataset-like": (404, "EntryNotFound")}


class _FakeHub(http.server.BaseHTTPRequestHandler):
    requested: list[str] = []

    def _answer(self, with_body: bool) -> None:
        type(self).requested.append(self.path)
        repo = self.path.split("/resolve/")[0].strip("/")
        if self.path == "/":
            status, headers, body = 200, {}, b""
        elif repo in ERRORS:
            status, code = ERRORS[repo]
            status, headers, body = status, {"X-Error-Code": code, "X-Error-Message": code}, b""
        else:
            body = json.dumps({"model_type": "llama", **TINY_CONFIG}).encode()
            status, headers = 200, {"ETag": '"config-etag"', "X-Repo-Commit": COMMIT}
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_HEAD(self):  # noqa: N802 (http.server's names)
        self._answer(with_body=False)

    def do_GET(self):  # noqa: N802
        self._answer(with_body=True)

    def log_message(self, *args):
        pass


@pytest.fixture
def hub_online(monkeypatch, tmp_path):
    """HF_HUB_OFFLINE off, an empty cache, and the hub endpoint a local server that answers as the hub."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    _FakeHub.requested = []
    _hub_at(monkeypatch, tmp_path, f"http://127.0.0.1:{server.server_address[1]}")
    yield _FakeHub.requested
    server.shutdown()


def _hub_at(monkeypatch, tmp_path, endpoint: str) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)  # as HF_ENDPOINT sets it at import
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens there once the socket is closed


def _refused(call, *args) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(DemoInputError) as raised:
        call(*args)
    return str(raised.value), time.monotonic() - started


def test_an_uncached_hub_id_without_a_network_fails_at_once_with_that_reason(monkeypatch, tmp_path):
    _hub_at(monkeypatch, tmp_path, f"http://127.0.0.1:{_closed_port()}")
    message, seconds = _refused(load_model_source, "gpt2")
    # was 23 s of the hub client's retries, then "not a loadable hub id"
    assert seconds < 5, seconds
    assert message.startswith("cannot load model 'gpt2': no network (127.0.0.1 cannot be reached), and gpt2 is "
                              "not in the local cache"), message


def test_a_hub_that_never_answers_is_given_up_after_the_check_timeout(monkeypatch, tmp_path):
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        _hub_at(monkeypatch, tmp_path, f"http://127.0.0.1:{silent.getsockname()[1]}")
        started = time.monotonic()
        assert offline_reason() == "no network (127.0.0.1 cannot be reached)"
        assert time.monotonic() - started < HUB_CHECK_TIMEOUT_S + 3


def test_hf_hub_offline_is_the_reason_without_asking_the_network(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    message, seconds = _refused(load_model_source, "some-org/some-model")
    assert "offline (HF_HUB_OFFLINE is set), and some-org/some-model is not in the local cache" in message
    assert seconds < 5, seconds


@pytest.mark.parametrize("repo, reason", [
    ("missing-org/missing-model", "the hub has no model missing-org/missing-model (or it is private"),
    ("some-org/gated-model", "some-org/gated-model is gated on the hub"),
    ("some-org/dataset-like", "some-org/dataset-like on the hub has no config.json: not a transformers model"),
])
def test_a_hub_that_answers_says_what_is_wrong_with_the_id(hub_online, repo, reason):
    message, _ = _refused(load_model_source, repo)
    assert message.startswith(f"cannot load model {repo!r}: {reason}"), message
    assert any(path.startswith(f"/{repo}/resolve/") for path in hub_online)  # the hub was asked, not guessed


def test_local_folder_problems_are_not_hub_problems(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(DemoInputError, match="is a file; give a folder"):
        preview(RunConfig(model=str(tmp_path / "weights.bin"), samples=8))
    with pytest.raises(DemoInputError, match="has no config.json: it is not a model folder"):
        preview(RunConfig(model=str(tmp_path), samples=8))
    with pytest.raises(DemoInputError, match="no folder of that name here, and not a preset .* or a hub id"):
        preview(RunConfig(model=str(tmp_path / "missing" / "model"), samples=8))


def test_the_planner_plans_any_hub_id_from_its_config_json_alone(hub_online):
    config = load_config("some-org/tiny-model")
    assert (config.model_type, config.hidden_size) == ("llama", 64)
    # one file fetched, never the weights or the tokenizer
    assert {path for path in hub_online if path != "/"} == {"/some-org/tiny-model/resolve/main/config.json"}
    answer = plan(PlanRequest(model="some-org/tiny-model", batch_size=2, seq_length=128, device="cpu",
                              precision="fp32")).to_dict()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**TINY_CONFIG))
    assert answer["params"] == sum(p.numel() for p in model.parameters())
    # cached now: the hub is not asked again
    requested = len(hub_online)
    load_config("some-org/tiny-model")
    assert len(hub_online) == requested


def test_the_planner_offline_says_why_and_how_to_fetch_the_config(monkeypatch, tmp_path):
    _hub_at(monkeypatch, tmp_path, f"http://127.0.0.1:{_closed_port()}")
    message, seconds = _refused(load_config, "some-org/some-model")
    assert "no network (127.0.0.1 cannot be reached), and some-org/some-model is not in the local cache " \
           "(`hf download some-org/some-model config.json`" in message, message
    assert seconds < 5
    assert huggingface_hub.try_to_load_from_cache("some-org/some-model", "config.json") is None
