"""The FrozenLake study's run and training stages now live in `jaxagent.study.frozenlake` (`run`, `train`); this
module keeps the names experiments/host_study.py reads from it."""
from jaxagent.study.frozenlake.run import (RESULT_NEUTRAL, Run, check_batches, check_preset, check_update,
                                           make_run_mesh, save_policy)
from jaxagent.study.frozenlake.train import SavedPolicies

__all__ = ["RESULT_NEUTRAL", "Run", "SavedPolicies", "check_batches", "check_preset", "check_update", "make_run_mesh",
           "save_policy"]
