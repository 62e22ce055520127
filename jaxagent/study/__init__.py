"""The study's stages as library functions (the experiments/ scripts are thin wrappers around them): the toy
world (`make_toy_world`: word-level tokenizer, FrozenLake, chat layout), the SFT base (`train_base`), the RL
arms (`train_rl`), and the host domains (SQL, BFCL, code: `make_host_world`, `train_host_rl`). The FrozenLake
study itself (presets, run directory, training and eval stages, report, sweeps): `jaxagent.study.frozenlake`;
the host-domain study: `jaxagent.study.host`; what both share (run checks, arms, SFT fit, saved policies,
estimates): `jaxagent.study.common`.

The names below load their module on first use (the study pulls in every layer)."""
import importlib

_EXPORTS = {
    "toy": ("ToyWorld", "make_toy_world", "expert_rollouts"),
    "stages": ("TaskSettings", "BaseSettings", "train_base", "make_arm_runtime"),
    "common.arms": ("ArmSettings", "train_rl", "init_arm_state"),
    "host.stages": ("HostDomain", "register_domain", "get_domain", "HostTaskSettings", "make_host_world",
                    "train_host_rl"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"jaxagent.study.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'jaxagent.study' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_WHERE))


__all__ = sorted(_WHERE)
