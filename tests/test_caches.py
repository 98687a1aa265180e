"""The engine's caches that outlive a call: each keeps a bounded number of entries, and `release_caches` empties them
all (what a long-running server relies on, and what the tests call after every file)."""

from __future__ import annotations

import gc
import weakref

import demo_core
from demo_core.attention import preflight
from demo_core.caches import LRU, release_memory
from demo_core.memory import parameters, planner, probe_model
from demo_core.memory import probe as activation_probe
from demo_core.models.sources import load_model_source

from tiny_models import family_config


def test_an_lru_keeps_its_most_recently_used_entries():
    cache = LRU(max_entries=2)
    cache["a"], cache["b"] = 1, 2
    assert cache["a"] == 1  # read: now the most recent
    cache["c"] = 3
    assert dict(cache) == {"a": 1, "c": 3}  # "b" was the least recently used
    cache["a"] = 4
    cache["d"] = 5
    assert dict(cache) == {"a": 4, "d": 5}


def test_release_caches_empties_every_engine_cache():
    parameters.param_facts(family_config("llama"))
    planner.dataset_lengths("flan-like", 8, 0)
    preflight.check_packing_is_exact(load_model_source("tiny-llama"), "sdpa", "cpu", ("flatten",))
    activation_probe._FIT_CACHE["a fit"] = "its numbers"
    probe_model.rederived_fields(family_config("llama"))
    assert probe_model._DERIVED and probe_model._REDERIVED
    assert parameters._PARAM_FACTS_CACHE and preflight._passed and planner._tokenized_lengths.cache_info().currsize
    demo_core.release_caches()
    assert not parameters._PARAM_FACTS_CACHE and not preflight._passed and not activation_probe._FIT_CACHE
    assert not probe_model._DERIVED and not probe_model._REDERIVED
    assert planner._tokenized_lengths.cache_info().currsize == 0


class Cycle:  # an object that only the cyclic collector frees
    def __init__(self):
        self.me = self


def test_objects_frozen_at_start_up_are_left_out_of_each_runs_collection_and_a_runs_cycles_are_still_freed():
    at_start_up = Cycle()
    try:
        demo_core.freeze_start_up_objects()
        left_at_start_up = weakref.ref(at_start_up)
        del at_start_up
        made_by_a_run = Cycle()
        left_by_the_run = weakref.ref(made_by_a_run)
        del made_by_a_run
        release_memory()  # after every burst and run
        assert left_by_the_run() is None  # collected as before
        assert left_at_start_up() is not None  # never walked: a server's start-up objects live as long as it does
    finally:
        gc.unfreeze()  # this test process goes on as before
        gc.collect()
