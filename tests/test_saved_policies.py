"""`SavedPolicies`: the studies keep no trained policy on the device between uses; each is read from its
run directory when asked for (an accelerator run's arms x seeds would not fit beside the train state)."""
import pytest

from jaxagent.study.common.policies import SavedPolicies


def test_saved_policies_load_on_demand_and_keep_nothing():
    calls = []

    def load(arm, seed):
        calls.append((arm, seed))
        return {"w": (arm, seed)}

    pol = SavedPolicies([("ppo", 1), ("grpo", 1), ("grpo", 0)], load)
    assert list(pol) == [("grpo", 0), ("grpo", 1), ("ppo", 1)] and len(pol) == 3 and calls == []
    assert [s for a, s in pol if a == "grpo"] == [0, 1] and calls == []   # keys alone load nothing
    assert pol[("grpo", 1)] == {"w": ("grpo", 1)} and calls == [("grpo", 1)]
    pol[("grpo", 1)]
    assert calls == [("grpo", 1)] * 2                                     # read again: nothing was kept
    assert ("ppo", 1) in pol and ("ppo", 0) not in pol and calls == [("grpo", 1)] * 2
    with pytest.raises(KeyError):
        pol[("ppo", 0)]
