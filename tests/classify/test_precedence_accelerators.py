"""Other accelerators and object-store mounts: the device or the store that failed is the root.

Cases from the source audits of Ascend (torch_npu, CANN), Gaudi (habanalabs, HCL), AMD (ROCr,
amdgpu) and the FUSE daemons that mount object stores: a hardware fault beats the collective
timeout it causes, an ECC-caused memory fault is the memory's and not the program's, and a FUSE
daemon's failed upload explains the worker's bare "Input/output error".
"""

from __future__ import annotations

import pytest

from kcover import Action, Category, explain

HCCL_TIMEOUT = ("Some HCCL operations have failed or timed out. Due to the asynchronous nature of ASCEND kernels, "
                "subsequent NPU operations might run on corrupted/incomplete data.\n")


@pytest.mark.parametrize(
    "fault",
    [
        "RuntimeError: synchronize:torch_npu/csrc/core/npu/NPUStream.cpp:412 NPU function error: HBM MULTI BIT ECC "
        "ERROR, error code is 507054",
        "[ 8830.004512] habanalabs hl3: 0000:b3:00.0 Failed to reset! Device is NOT usable",
        "[76914.152141] amdgpu 0000:dd:00.0: {1}uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT) detected!",
    ],
    ids=["npu-hbm-ecc", "gaudi-reset-failed", "amd-athub"],
)
def test_an_accelerator_fault_is_the_root_of_the_collective_timeout(fault: str) -> None:
    for log in (fault + "\n" + HCCL_TIMEOUT, HCCL_TIMEOUT + fault + "\n"):
        verdict = explain(log)
        assert (verdict.category, verdict.node_at_fault) == (Category.GPU_HARDWARE, True)
        assert verdict.action is Action.RESTART_EXCLUDING_NODES


def test_a_memory_fault_caused_by_ecc_is_the_memorys() -> None:
    fault = "Memory access fault by GPU node-5 (Agent handle: 0x55d1c7a3f110) on address 0x7e8a00200000. Reason: {}."
    by_ecc = explain(fault.format("DRAM ECC failure") + "\n")
    assert (by_ecc.category, by_ecc.node_at_fault) == (Category.GPU_HARDWARE, True)
    by_program = explain(fault.format("Page not present or supervisor privilege") + "\n")
    assert (by_program.category, by_program.node_at_fault) == (Category.CUDA_SOFTWARE, False)


def test_the_fuse_daemons_failure_explains_the_workers_io_error() -> None:
    worker = "OSError: [Errno 5] Input/output error: '/mnt/s3/ckpt/step_12000/model_states.pt'\n"
    daemon = "2024-05-01T10:15:42.007Z [ERR] curl.cpp:RequestPerform(2014): CURL ERROR(28) : Timeout was reached\n"
    verdict = explain(worker + daemon)
    assert (verdict.category, verdict.rule) == (Category.STORAGE_IO, "storage.fuse-daemon-error")


def test_a_mounts_refusal_of_an_unsupported_write_is_not_a_storage_fault() -> None:
    refused = ('2024-05-01T10:20:44.880016Z  WARN write{req=52 ino=49 fh=3 offset=512 length=512 name="model.pt"}: '
               "mountpoint_s3_fs::fuse: write failed: upload error: out of order write NOT supported by Mountpoint, "
               "aborting the upload; expected offset 0 but got 512\n")
    assert explain(refused).category is not Category.STORAGE_IO
