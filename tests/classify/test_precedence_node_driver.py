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


@pytest.mark.parametrize(
    "at_init",
    [
        "UserWarning: CUDA initialization: CUDA unknown error - this may be due to an incorrectly set up "
        "environment, e.g. changing env variable CUDA_VISIBLE_DEVICES after program start.",
        "E tensorflow/stream_executor/cuda/cuda_driver.cc:509] failed call to cuInit: CUDA_ERROR_UNKNOWN",
        TORCH_CASCADE.replace("Error 803: system has unsupported display driver / cuda driver combination",
                              "Error 999: unknown error").strip(),
    ],
    ids=["torch-warning", "tf-cuinit", "torch-device-count"],
)
def test_cudas_unknown_error_at_initialisation_is_the_drivers_and_mid_run_the_gpus(at_init: str) -> None:
    # before any kernel ran, 999 is the driver's state (nvidia-uvm missing, a resume from suspend); a GPU
    # that is lost while the job runs answers a later call with it
    verdict = explain(at_init + "\n")
    assert (verdict.rule, verdict.category, verdict.node_at_fault) == (
        "cuda.node-driver-broken", Category.CUDA_SOFTWARE, True)
    mid_run = explain("step 1200 loss 2.31\nRuntimeError: CUDA error: unknown error\n")
    assert (mid_run.category, mid_run.node_at_fault) == (Category.GPU_HARDWARE, True)


def test_a_gpu_busy_or_unavailable_excludes_the_node_and_no_gpu_at_all_does_not() -> None:
    # 46: the GPU the job was given cannot take a context (a leftover process holds it, or it is stuck)
    busy = explain("RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable\n")
    assert (busy.rule, busy.node_at_fault, busy.action) == (
        "cuda.device-unavailable", True, Action.RESTART_EXCLUDING_NODES)
    # 100: the worker was given no GPU at all, which is the pod's request, not the node
    none = explain("RuntimeError: No CUDA GPUs are available\n")
    assert (none.rule, none.node_at_fault) == ("cuda.no-device", False)
