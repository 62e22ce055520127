"""The experiment scripts (`python -m experiments.<name>`). On a machine with no accelerator device, they run JAX on
the CPU alone (`JAX_PLATFORMS=cpu` unless the environment sets it): libtpu, installed with the test and AOT extras,
otherwise logs a TPU initialisation error in every process of a machine without a TPU."""
import glob
import os

_DEVICES = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*")  # TPU VMs (v4; v5e/v5p), NVIDIA GPUs
if "JAX_PLATFORMS" not in os.environ and not any(glob.glob(pattern) for pattern in _DEVICES):
    os.environ["JAX_PLATFORMS"] = "cpu"
