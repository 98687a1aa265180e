"""The engine's caches that outlive a call, each bounded, one call that empties them all (`release_caches`), and the
call that hands freed memory back to the system (`release_memory`).

A server runs for weeks, and a cache keyed by what visitors ask (models, settings, uploaded model folders) grows with
every new question unless it has a size: so each is an `LRU` with a stated number of entries (why that number is
next to each), or a functools.lru_cache with a maxsize. Every one registers here, and `release_caches()` empties them
all: the tests call it after each test file, so that nothing one file computed stays resident under the next.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import gc
import threading
from collections.abc import Callable, Hashable, Iterator, MutableMapping
from typing import Any

import torch

_CLEARS: list[Callable[[], None]] = []  # every registered cache's clear


class LRU(MutableMapping):
    """A mapping that keeps its `max_entries` most recently used entries (thread-safe: the app's runs and planner
    share them from worker threads)."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._entries: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        _CLEARS.append(self.clear)

    def __getitem__(self, key: Hashable) -> Any:
        with self._lock:
            value = self._entries[key]
            self._entries.move_to_end(key)
            return value

    def __setitem__(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def __delitem__(self, key: Hashable) -> None:
        with self._lock:
            del self._entries[key]

    def __iter__(self) -> Iterator[Hashable]:
        with self._lock:
            return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def registered(cached: Callable) -> Callable:
    """A functools.lru_cache'd function (or anything with `cache_clear`), emptied by `release_caches` too."""
    _CLEARS.append(cached.cache_clear)
    return cached


def on_release(clear: Callable[[], None]) -> Callable[[], None]:
    """Registers the clear of a cache that is neither an `LRU` nor an lru_cache (e.g. one forward's segments)."""
    _CLEARS.append(clear)
    return clear


def release_caches() -> None:
    """Empties every cache the engine keeps across calls, then hands the freed memory back (`release_memory`)."""
    for clear in _CLEARS:
        clear()
    release_memory()


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (macOS, musl)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def release_memory() -> None:
    """Frees what a burst or run left behind and hands it back to the system, so the next one starts level.

    gc first (the model, optimizer and Trainer form cycles), then the CUDA cache, then glibc's trim: without it
    glibc keeps the freed heap of a run (~300 MB for a tiny CPU run) and a server's resident memory steps up by a
    third over its first few runs (benchmarks/soak.py) even though no object survives.
    """
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def freeze_start_up_objects() -> None:
    """Takes every object alive now out of the garbage collector's reach for good (gc.freeze), after collecting what
    is already garbage. A server calls it once its modules are imported and its page built: those live as long as the
    process, and `release_memory`'s full collection (after every burst and run) then walks only what the runs made.
    That collection holds the GIL, so the page's end of a run waited for it: 0.66-0.78 s over a server's 630k start-up
    objects with every core busy, under 0.1 ms once they are frozen (benchmarks/stop_latency.py --collection)."""
    gc.collect()
    gc.freeze()
