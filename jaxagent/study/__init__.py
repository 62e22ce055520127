"""The study's stages as library functions (the experiments/ scripts are thin wrappers around them): the toy
world (`make_toy_world`: word-level tokenizer, FrozenLake, chat layout), the SFT base (`train_base`), the RL
arms (`train_rl`), and the host domains (SQL, BFCL, code: `make_host_world`, `train_host_rl`). The FrozenLake
study itself (presets, run directory, training and eval stages, report, sweeps): `jaxagent.study.frozenlake`;
the host-domain study: `jaxagent.study.host`; what both share (run checks, arms, SFT fit, saved policies,
estimates): `jaxagent.study.common`.

The names below load their module on first use (the study pulls in every layer)."""
from jaxagent.lazy import lazy_names

_EXPORTS = {
    "toy": ("ToyWorld", "make_toy_world", "expert_rollouts"),
    "stages": ("TaskSettings", "BaseSettings", "train_base", "make_arm_runtime"),
    "common.arms": ("ArmSettings", "train_rl", "init_arm_state"),
    "host.domains": ("HostDomain", "register_domain", "get_domain"),
    "host.stages": ("HostTaskSettings", "make_host_world", "train_host_rl"),
}
__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
