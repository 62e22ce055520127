"""The host-domain study's presets are `jaxagent.study.host.presets.HOST_PRESETS`; experiments/cli.py reads them
under this name."""
from jaxagent.study.host.presets import HOST_PRESETS  # noqa: F401
