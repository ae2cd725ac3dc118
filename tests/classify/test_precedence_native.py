"""Native runtimes under the job: the layer that refused names the fault, not the abort it causes.

Cases from the audit of glibc, libstdc++/libc++, CPython, LLVM/GNU OpenMP, OpenBLAS and the
sanitizers: an exhausted thread or process limit is the host's (restartable), an image whose
libraries do not fit together is the user's (fail fast), and a bare abort stays a cascade.
"""

from __future__ import annotations

import pytest

from kcover import Action, Category, explain


@pytest.mark.parametrize(
    "log",
    [
        "terminate called after throwing an instance of 'std::system_error'\n"
        "  what():  Resource temporarily unavailable\nAborted (core dumped)\n",
        "OpenBLAS blas_thread_init: pthread_create failed for thread 12 of 64: Resource temporarily unavailable\n"
        "Segmentation fault (core dumped)\n",
        "Traceback (most recent call last):\n  File \"/usr/lib/python3.10/threading.py\", line 935, in start\n"
        "    _start_new_thread(self._bootstrap, ())\nRuntimeError: can't start new thread\n",
        "libgomp: Thread creation failed: Resource temporarily unavailable\n",
    ],
    ids=["std-thread", "openblas-then-segfault", "python-thread", "libgomp"],
)
def test_a_thread_limit_is_the_hosts_and_restartable(log: str) -> None:
    verdict = explain(log)
    assert (verdict.category, verdict.rule) == (Category.HOST_SYSTEM, "host.process-limit"), log
    assert verdict.action is Action.RESTART


@pytest.mark.parametrize(
    "log",
    [
        "Traceback (most recent call last):\n  File \"/workspace/train.py\", line 3, in <module>\n    import torch\n"
        "ImportError: /usr/lib/aarch64-linux-gnu/libgomp.so.1: cannot allocate memory in static TLS block\n",
        "python: symbol lookup error: /opt/conda/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so: undefined "
        "symbol: ncclCommRegister\n",
        "OMP: Error #15: Initializing libiomp5.so, but found libomp.so already initialized.\nAborted (core dumped)\n",
        "Fatal glibc error: CPU does not support x86-64-v2\n",
    ],
    ids=["static-tls-not-memory", "undefined-symbol", "two-openmp-runtimes", "isa-level"],
)
def test_an_image_whose_native_parts_do_not_fit_fails_fast(log: str) -> None:
    verdict = explain(log)
    assert verdict.category is Category.USER_CODE, log
    assert verdict.rule == "native.image-mismatch"
    assert verdict.action is Action.FAIL


def test_a_glibc_assertion_is_an_abort_but_a_cuda_device_assert_is_cudas() -> None:
    glibc = explain("python: ../nptl/pthread_mutex_lock.c:94: ___pthread_mutex_lock: Assertion "
                    "`mutex->__data.__owner == 0' failed.\n")
    assert (glibc.category, glibc.rule) == (Category.OTHER, "host.abort")
    device = explain("/pytorch/aten/src/ATen/native/cuda/Indexing.cu:662: indexSelectLargeIndex: block: [148,0,0], "
                     "thread: [96,0,0] Assertion `srcIndex < srcSelectDimSize` failed.\n")
    assert device.category is Category.CUDA_SOFTWARE


def test_the_sanitizers_memory_report_is_the_program_and_its_oom_the_hosts() -> None:
    bug = explain("==23456==ERROR: AddressSanitizer: heap-use-after-free on address 0x602000012f50 at pc "
                  "0x7f8e4c3a1b2d bp 0x7ffd2a1c3e40 sp 0x7ffd2a1c3e38\n")
    assert (bug.category, bug.action) == (Category.USER_CODE, Action.FAIL)
    oom = explain("==23456==ERROR: AddressSanitizer: out of memory: allocator is trying to allocate "
                  "0x4000000000 bytes\n")
    assert oom.category is Category.HOST_SYSTEM


def test_a_retrying_fork_is_not_yet_a_failure() -> None:
    assert explain("bash: fork: retry: Resource temporarily unavailable\n").category is None
