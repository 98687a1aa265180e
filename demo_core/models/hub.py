"""The Hugging Face hub, asked only when it answers: whether it can be reached, decided in about a second, and the
one reason a hub id cannot be used.

Without a network the hub client retries each request five times with growing pauses: typing `gpt2` on a machine
without one took 23 s before it failed, and then blamed the id ("not a loadable hub id"). So before anything is
fetched, `offline_reason` asks once: huggingface_hub's own switch (HF_HUB_OFFLINE) answers at once; otherwise one
HEAD request to the hub's endpoint through the hub client's session (its proxies and endpoint settings), bounded by
`HUB_CHECK_TIMEOUT_S` including the name lookup, which no socket timeout bounds. When the hub cannot be reached only
the local cache is read, and a hub id that is not there fails with that reason. When it can, `config_file` fetches a
model's `config.json` alone (as the model-memory Space does for its estimates) and tells a missing repository, a
gated one and one without a config apart.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from urllib.parse import urlparse

import huggingface_hub
from huggingface_hub import constants, try_to_load_from_cache
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HFValidationError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import get_session, validate_repo_id

from demo_core.errors import DemoInputError

# The hub answers a HEAD request in ~0.1-0.3 s from a connected machine; without a network the name lookup fails at
# once (measured here) or, behind a resolver that does not answer, this bounds the wait.
HUB_CHECK_TIMEOUT_S = 2.0
CONFIG_NAME = "config.json"
_TRUE = {"1", "ON", "YES", "TRUE"}


def offline_mode() -> bool:
    """huggingface_hub's HF_HUB_OFFLINE, also when it was set after the hub client was imported."""
    return huggingface_hub.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def _answers(endpoint: str, timeout_s: float) -> bool:
    answered: list[bool] = []

    def ask() -> None:
        try:
            get_session().head(endpoint, timeout=timeout_s)
            answered.append(True)
        except Exception:  # any failure to get an answer (DNS, refused, TLS, timeout) means unreachable here
            answered.append(False)

    # A daemon thread, so that a name lookup no timeout bounds cannot hold the caller (or the exit) up.
    thread = threading.Thread(target=ask, name="packing-lab-hub-check", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return answered == [True]


def offline_reason(timeout_s: float = HUB_CHECK_TIMEOUT_S) -> str | None:
    """None when the hub can be asked; otherwise why not, in words for a message."""
    if offline_mode():
        return "offline (HF_HUB_OFFLINE is set)"
    if not _answers(constants.ENDPOINT, timeout_s):
        return f"no network ({urlparse(constants.ENDPOINT).hostname} cannot be reached)"
    return None


def is_hub_id(name: str) -> bool:
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def is_cached(repo_id: str, filename: str = CONFIG_NAME) -> bool:
    return isinstance(try_to_load_from_cache(repo_id, filename), str)


def dataset_in_cache(repo_id: str) -> bool:
    """Whether a hub dataset has files in the local caches: the hub client's (`datasets--owner--name`) or datasets'
    own prepared copies (`owner___name`), which `datasets.load_dataset` reads offline."""
    import datasets.config

    hub_folder = Path(constants.HF_HUB_CACHE) / f"datasets--{repo_id.replace('/', '--')}"
    return hub_folder.is_dir() or (Path(datasets.config.HF_DATASETS_CACHE) / repo_id.replace("/", "___")).is_dir()


def not_cached(repo_id: str, reason: str, *files: str) -> str:
    """The words for a hub id that cannot be fetched (`reason`) and is not in the local cache, with the command that
    puts it (or only `files` of it) there."""
    command = " ".join(("hf download", repo_id, *files))
    return f"{reason}, and {repo_id} is not in the local cache (`{command}` fetches it once the hub can be reached)"


def config_file(repo_id: str) -> str:
    """The path of `repo_id`'s config.json: from the local cache, or fetched alone when the hub can be reached.
    DemoInputError otherwise, saying which of these it is: no network (and not cached), no such repository (or a
    private one), a gated one, a repository without a config.json."""
    cached = try_to_load_from_cache(repo_id, CONFIG_NAME)
    if isinstance(cached, str):
        return cached
    reason = offline_reason()
    if reason is not None:
        raise DemoInputError(not_cached(repo_id, reason, CONFIG_NAME))
    try:
        return huggingface_hub.hf_hub_download(repo_id, CONFIG_NAME)
    except GatedRepoError:  # before RepositoryNotFoundError, its parent class
        raise DemoInputError(f"{repo_id} is gated on the hub: accept its terms on its page and log in "
                             f"(`hf auth login`)") from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise DemoInputError(f"the hub has no model {repo_id} (or it is private: log in with `hf auth login`)") \
            from None
    except EntryNotFoundError:
        raise DemoInputError(f"{repo_id} on the hub has no {CONFIG_NAME}: not a transformers model") from None
    except OSError as error:  # the hub answered the check but not the download (HfHubHTTPError is an OSError)
        raise DemoInputError(f"could not fetch {repo_id}'s {CONFIG_NAME} from the hub ({type(error).__name__})") \
            from None
