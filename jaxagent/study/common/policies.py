"""The trained policies of a study run: written once by process 0 (`save_policy`, HF layout), read back one at a
time when asked for (`SavedPolicies`)."""
from __future__ import annotations

import collections.abc

import jax

from jaxagent.models import weights
from jaxagent.study.run_dir import is_main_process, sync_processes


def save_policy(path, cfg, params):
    """weights.save of (possibly sharded, possibly multi-process) params, written by process 0."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        params = multihost_utils.process_allgather(params, tiled=True)
    if is_main_process():
        weights.save(path, cfg, params)
    sync_processes(f"save_policy:{path}")


class SavedPolicies(collections.abc.Mapping):
    """(arm, seed) -> that arm seed's trained params, read by `load(arm, seed)` from its run directory each time
    one is asked for and never kept here, so a run holds one trained policy at a time on its devices however
    many arms x seeds it has (on a 1-GPU preset 15 Qwen3-0.6B policies in f32 are 33 GiB, beside the train state
    and the rollout's KV cache). Iterating gives the keys in sorted order; index to load. A comprehension over
    `items()` loads every policy at once: take keys, then fetch one at a time."""

    def __init__(self, keys, load):
        self._keys, self._load = sorted(keys), load

    def __getitem__(self, key):
        if key not in self._keys:
            raise KeyError(key)
        return self._load(*key)

    def __contains__(self, key):  # Mapping's would load the policy
        return key in self._keys

    def __iter__(self):
        return iter(self._keys)

    def __len__(self):
        return len(self._keys)
