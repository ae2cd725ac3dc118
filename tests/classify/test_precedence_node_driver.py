"""A node whose NVIDIA driver is broken is excluded, and its fault is the driver's, not a GPU's.

NVML's own return codes separate the two (nvml.h): a driver that is not loaded, that does not
match its user-space libraries or that the OS blocks is the node's software; a GPU the driver
reports lost or in need of a reset is the GPU's. Both exclude the node; only the category differs.
"""

from __future__ import annotations

import pytest

from kcover import Action, Category, explain

TORCH_CASCADE = (
    "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
    "NumCudaDevices() that might have already set an error? Error 803: system has unsupported display driver / "
    "cuda driver combination\n"
)


@pytest.mark.parametrize(
    "driver",
    [
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
        "NVIDIA driver is installed and running.",
        "Failed to initialize NVML: Driver/library version mismatch",
        "Failed to initialize NVML: Unknown Error",
        "pynvml.nvml.NVMLError_DriverNotLoaded: Driver Not Loaded",
        "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown",
    ],
    ids=["smi-no-driver", "lib-mismatch", "nvml-unknown", "pynvml-not-loaded", "container-cli"],
)
def test_a_broken_driver_excludes_the_node_as_software(driver: str) -> None:
    for log in (driver + "\n", driver + "\n" + TORCH_CASCADE):
        verdict = explain(log)
        assert (verdict.category, verdict.node_at_fault) == (Category.CUDA_SOFTWARE, True), log
        assert verdict.rule == "cuda.node-driver-broken"
        assert verdict.action is Action.RESTART_EXCLUDING_NODES


@pytest.mark.parametrize(
    "gpu",
    [
        "nvidia-container-cli: detection error: nvml error: gpu requires reset: unknown",
        "nvidia-container-cli: detection error: driver error: timed out: unknown",
    ],
)
def test_a_gpu_the_driver_lost_is_the_gpus(gpu: str) -> None:
    verdict = explain(gpu + "\n")
    assert (verdict.category, verdict.node_at_fault) == (Category.GPU_HARDWARE, True)
    assert verdict.action is Action.RESTART_EXCLUDING_NODES


def test_permissions_are_not_a_broken_driver() -> None:
    verdict = explain("pynvml.nvml.NVMLError_NoPermission: Insufficient Permissions\n")
    assert verdict.rule != "cuda.node-driver-broken"
    assert not verdict.node_at_fault
