# ruff: noqa: E501 - the excerpts are whole log lines as the tools print them; wrapping them would change them
"""Precedence between network, NCCL and PyTorch signs on multi-line excerpts.

Each case is what one rank prints when a fault surfaces through several layers:
the wrapper (an NCCL result code, a rendezvous or watchdog timeout, a launcher
stopping workers) must lose to the specific fault it wraps, and a wrapper seen
alone must still give a verdict.  Real ``explain()`` calls on the shipped catalog.
"""

from __future__ import annotations

import pytest

from kcover import Category, explain


def _verdict(text: str) -> tuple[Category | None, str | None]:
    verdict = explain(text)
    return verdict.category, verdict.rule


CUDA_INSIDE_NCCL = """\
node-7:41122:41390 [3] enqueue.cc:1560 NCCL WARN Cuda failure 'an illegal memory access was encountered'
node-7:41122:41390 [3] NCCL INFO enqueue.cc:1604 -> 1
[rank3]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5
[rank3]: ncclUnhandledCudaError: Call to CUDA function failed.
[rank3]: Last error:
[rank3]: Cuda failure 'an illegal memory access was encountered'
"""

CUDA_INIT_INSIDE_NCCL = """\
worker-1:     work = default_pg.barrier(opts=opts)
worker-1: torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1197, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.3
worker-1: ncclUnhandledCudaError: Call to CUDA function failed.
worker-1: Last error:
worker-1: Cuda failure 'initialization error'
"""

REFUSED_THEN_RENDEZVOUS_TIMEOUT = """\
node-1:411:470 [3] NCCL INFO socketPollConnect: connect to 10.1.0.4<49121> returned Connection refused, retrying (1/35) after sleep for 100 msec
node-1:411:470 [3] NCCL INFO socketPollConnect: connect to 10.1.0.4<49121> returned Connection refused, retrying (2/35) after sleep for 200 msec
node-1:411:470 [3] misc/socket.cc:556 NCCL WARN socketPollConnect: Connect to 10.1.0.4<49121> failed : Connection refused
node-1:411:470 [3] NCCL INFO bootstrap.cc:270 -> 2
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5
torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError
"""

STORE_REFUSED_THEN_STORE_TIMEOUT = """\
[W socket.cpp:601] [c10d] The client socket has failed to connect to [job-master-0]:29500 (errno: 111 - Connection refused).
torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.
"""

IB_COMPLETION_UNDER_NCCL_ERRORS = """\
node-1:811:930 [5] NCCL WARN NET/IB : Got completion from peer 10.0.2.14<46813> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.2.11 remoteGid ::ffff:10.0.2.14
node-1:811:930 [5] NCCL INFO transport/net.cc:1134 -> 6
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5
ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.
[rank5]:[E ProcessGroupNCCL.cpp:1414] [PG 0 Rank 5] Process group watchdog thread terminated with exception: NCCL error: remote process exited or there was a network error
"""

PORT_DOWN_UNDER_REMOTE_ERROR = """\
node-3:4410:4521 [0] NCCL WARN NET/IB : Got async event : port error
node-3:4410:4521 [0] NCCL WARN NET/IB : Got completion from peer 10.0.2.9<46813> with error 12, opcode 0, len 0, vendor err 129
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version 2.20.5
"""

MR_REGISTRATION_UNDER_ENOMEM = """\
libfabric:15409:1705531788::efa:mr:efa_mr_reg_impl():850<warn> Unable to register MR: Cannot allocate memory
ip-10-0-78-113:3234:3425 [5] register_mr_buffers:469 NCCL WARN NET/OFI Unable to register memory (type = 1) for device 0. RC: -12, Error: Cannot allocate memory
RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, unhandled system error, NCCL version 2.18.1
"""

WORKER_KILLED_THEN_SIBLINGS_SIGNALLED = """\
WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 3721028 closing signal SIGTERM
WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 3721029 closing signal SIGTERM
ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 2 (pid: 3721030) of binary: /usr/bin/python3
"""

WATCHDOG_AFTER_PEER_RESET = """\
node-5:771:801 [1] misc/socket.cc:30 NCCL WARN socketProgressOpt: Call to recv from 10.0.0.8<51233> failed : Connection reset by peer
[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.
[rank1]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 1] Timeout at NCCL work: 88, last enqueued NCCL work: 88, last completed NCCL work: 87.
"""


@pytest.mark.parametrize(
    ("text", "category", "rule"),
    [
        pytest.param(CUDA_INSIDE_NCCL, Category.CUDA_SOFTWARE, "cuda.illegal-address", id="nccl-wraps-cuda-fault"),
        pytest.param(CUDA_INIT_INSIDE_NCCL, Category.CUDA_SOFTWARE, None, id="nccl-wraps-cuda-init-error"),
        pytest.param(
            REFUSED_THEN_RENDEZVOUS_TIMEOUT, Category.NCCL_COMMUNICATION, "nccl.socket-connect",
            id="refused-connect-beats-rendezvous-timeout",
        ),
        pytest.param(  # the refused connect is a retry warning (a healthy start prints it too): not the root
            STORE_REFUSED_THEN_STORE_TIMEOUT, Category.COLLECTIVE_TIMEOUT_HANG, "torch.store-timeout",
            id="store-timeout-after-refused-retries",
        ),
        pytest.param(
            IB_COMPLETION_UNDER_NCCL_ERRORS, Category.NETWORK_INFINIBAND, "ib.completion-error",
            id="ib-completion-beats-nccl-result-codes",
        ),
        pytest.param(PORT_DOWN_UNDER_REMOTE_ERROR, Category.NETWORK_INFINIBAND, "ib.port-down", id="port-down-is-root"),
        pytest.param(
            MR_REGISTRATION_UNDER_ENOMEM, Category.NETWORK_INFINIBAND, "ib.mr-registration",
            id="mr-registration-beats-enomem-and-system-error",
        ),
        pytest.param(
            WORKER_KILLED_THEN_SIBLINGS_SIGNALLED, Category.HOST_SYSTEM, "torch.elastic-sigkill",
            id="killed-worker-beats-closing-signals",
        ),
        pytest.param(
            WATCHDOG_AFTER_PEER_RESET, Category.NCCL_COMMUNICATION, "nccl.peer-closed",
            id="peer-reset-beats-watchdog-timeout",
        ),
    ],
)
def test_root_of_layered_excerpt(text: str, category: Category, rule: str | None) -> None:
    got_category, got_rule = _verdict(text)
    assert got_category is category, (got_category, got_rule)
    if rule is not None:
        assert got_rule == rule


def test_cuda_init_error_is_not_blamed_on_nccl() -> None:
    verdict = explain(CUDA_INIT_INSIDE_NCCL)
    assert verdict.rule not in ("nccl.cuda-error", "nccl.system-error")
    assert verdict.root is not None and verdict.root.role.value == "root"


@pytest.mark.parametrize(
    ("text", "category", "rule"),
    [
        pytest.param(
            "ncclUnhandledCudaError: Call to CUDA function failed.\n", Category.CUDA_SOFTWARE, "nccl.cuda-error",
            id="cuda-error-alone",
        ),
        pytest.param(
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970,"
            " unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5\n",
            Category.NCCL_COMMUNICATION, "nccl.system-error", id="system-error-alone",
        ),
        pytest.param(
            "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 3721028 closing signal SIGTERM\n",
            Category.OTHER, "torch.elastic-stopping-workers", id="closing-signal-alone",
        ),
    ],
)
def test_wrapper_alone_still_gives_a_cascade_verdict(text: str, category: Category, rule: str) -> None:
    verdict = explain(text)
    assert verdict.category is category
    assert verdict.rule == rule
    assert verdict.root is not None and verdict.root.role.value == "cascade"


@pytest.mark.parametrize(
    "text",
    [
        "node-1:411:470 [3] NCCL INFO socketPollConnect: connect to 10.1.0.4<49121> returned Connection refused,"
        " retrying (1/35) after sleep for 100 msec\nstep 12 loss 2.31\n",
        "flow-1:820398:820779 [0] NCCL INFO NET/IB : No device found.\n"
        "flow-1:820398:820779 [0] NCCL INFO NET/Socket : Using [0]eno3:10.0.0.8<0>\n",
        "[W TCPStore.cpp:358] [c10d] TCP client failed to connect/validate to host 10.0.0.9:46229 - retrying (try=0,"
        " timeout=600000ms, delay=88516ms): The client socket has timed out after 600000ms while trying to connect"
        " to (10.0.0.9, 46229).\nstep 1 loss 9.1\n",
        "[1732623600.102210] [gpu-node-a17:48213:0]           ib_md.c:927  UCX  WARN  IB: ibv_fork_init() was "
        "disabled or failed, yet a fork() has been issued.\nstep 3 loss 1.2\n",
    ],
    ids=["nccl-connect-retry", "no-ib-device-falls-back-to-sockets", "tcpstore-retry", "ucx-fork-warning"],
)
def test_retried_or_informational_lines_are_not_faults(text: str) -> None:
    verdict = explain(text)
    assert verdict.category is None, verdict.rule


def test_a_rank_that_reaches_the_store_before_it_is_up_is_no_fault() -> None:
    """torch's client retries while rank 0's store starts, warning each time (seen on real nodes whenever a
    pod's rank starts before rank 0's: an in-place restart's warm worker, or any job's start)."""
    retries = "\n".join(f"[W1202 03:09:1{i}.123456789 socket.cpp:752] [c10d] The client socket has failed to connect "
                        f"to [localhost]:29500 (errno: 111 - Connection refused)." for i in range(3))
    verdict = explain(retries + "\nrank 1 joined the process group of 2\nstep 1 loss 0.5\n")
    assert verdict.root is None and not verdict.faults


def test_an_mpi_completion_error_is_the_fabrics_not_the_disks() -> None:
    """Open MPI's OFI MTL names a completion's status with errno's words ("Input/output error")."""
    verdict = explain("mtl_ofi.h:181: Error returned from fi_cq_read: Input/output error(-5).\n"
                      "*** The Open MPI OFI MTL is aborting the MPI job (via exit(3)).\n")
    assert (verdict.category, verdict.rule) == (Category.NETWORK_INFINIBAND, "net.ofi-failure")


@pytest.mark.parametrize(
    "line",
    [
        "mlx5_core 0000:b5:00.0: mlx5_health_try_recover:357:(pid 1123): health recovery flow aborted, PCI reads "
        "still not working",
        "bond0: now running without any active interface!",
        "[1732623601.600120] [gpu-node-a17:48213:0]       ib_device.c:530  UCX  DIAG  IB Async event on mlx5_0: "
        "port error on port 1",
    ],
    ids=["mlx5-unrecoverable", "bond-without-slaves", "ucx-port-error"],
)
def test_a_local_adapter_or_link_failure_blames_the_node(line: str) -> None:
    verdict = explain(line + "\nRuntimeError: NCCL communicator was aborted on rank 3.\n")
    assert (verdict.category, verdict.node_at_fault) == (Category.NETWORK_INFINIBAND, True)
