"""Runtime errors reported as Python exceptions are the runtime's, not the user's bug.

JAX/XLA and TensorFlow raise their runtime's failures as exceptions (``XlaRuntimeError:
DEADLINE_EXCEEDED: …``, ``errors_impl.UnavailableError: …``); the generic ``python.exception``
rule would call them ``user_code`` and fail the job for good.  The launchers' own "a worker
failed" exceptions (horovodrun, Ray Train) leave the root to the worker's error.  Cases from the
runtimes audit (``catalog/runtimes.yaml``), each as a traceback ends.
"""

from __future__ import annotations

import pytest

from kcover import Action, Category, explain

TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 41, in <module>\n    main()\n'


@pytest.mark.parametrize(
    ("last_line", "category"),
    [
        ("jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: GetKeyValue() timed out with key: "
         "cuda:gpu_executable_nccl_unique_id_key:1 and duration: 5m", Category.COLLECTIVE_TIMEOUT_HANG),
        ("tensorflow.python.framework.errors_impl.DeadlineExceededError: Collective ops is aborted by: "
         "Collective has timed out during execution.", Category.COLLECTIVE_TIMEOUT_HANG),
        ("tensorflow.python.framework.errors_impl.UnavailableError: Collective ops is aborted by: "
         "failed to connect to all addresses", Category.NETWORK_INFINIBAND),
        ("tensorflow.python.framework.errors_impl.InternalError: Blas GEMM launch failed : "
         "a.shape=(256, 4096), b.shape=(4096, 4096), m=256, n=4096, k=4096 [Op:MatMul]", Category.CUDA_SOFTWARE),
        ("jaxlib.xla_extension.XlaRuntimeError: INTERNAL: Failed to execute XLA Runtime executable: "
         "jaxlib/gpu/prng_kernels.cc:33: operation gpuGetLastError() failed: out of memory.",
         Category.GPU_MEMORY_OOM),
    ],
    ids=["xla-kv-timeout", "tf-collective-timeout", "tf-peer-unreachable", "tf-gemm", "jax-oom"],
)
def test_a_runtime_failure_raised_as_an_exception_is_not_the_users_bug(last_line: str, category: Category) -> None:
    verdict = explain(TRACEBACK + last_line + "\n")
    assert verdict.category is category
    assert verdict.action is not Action.FAIL


@pytest.mark.parametrize(
    "launcher_line",
    [
        "RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus "
        "causing the job to be terminated. The first process to do so was:",
        "RuntimeError: mpirun failed with exit code 1",
        "ray.train.base_trainer.TrainingFailedError: The Ray Train run failed. Please inspect the previous "
        "error messages for a cause.",
        "(APIServer pid=3653) RuntimeError: Engine core initialization failed. See root cause above. Failed "
        "core proc(s): {}",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
        "for the root cause.",
    ],
    ids=["horovodrun", "mpirun", "ray-train", "vllm-engine-init", "vllm-engine-dead"],
)
def test_the_launchers_report_leaves_the_root_to_the_workers_error(launcher_line: str) -> None:
    worker = TRACEBACK + "KeyError: 'labels'\n"
    verdict = explain(worker + TRACEBACK + launcher_line + "\n")
    assert (verdict.category, verdict.rule) == (Category.USER_CODE, "python.exception")
    alone = explain(TRACEBACK + launcher_line + "\n")
    assert alone.category is Category.OTHER
    assert alone.action is Action.RESTART


@pytest.mark.parametrize(
    ("banner", "category"),
    [
        ("*** SIGSEGV (@0x0) received by PID 4121 (TID 0x7f1c3b2a1700) from PID 0; stack trace: ***",
         Category.HOST_SYSTEM),
        ("*** SIGBUS (@0x7f1c2a000000) received by PID 4121 (TID 0x7f1c3b2a1700) from PID 0; stack trace: ***",
         Category.HOST_SYSTEM),
        ("FatalError: `Segmentation fault` is detected by the operating system.", Category.HOST_SYSTEM),
    ],
    ids=["glog-segv", "glog-bus", "paddle-segv"],
)
def test_a_runtimes_signal_banner_is_the_signal(banner: str, category: Category) -> None:
    """glog's and PaddlePaddle's failure-signal handlers print the signal before the stack: it is the root."""
    header = '*** Aborted at 1700000000 (unix time) try "date -d @1700000000" if you are using GNU date ***\n'
    verdict = explain(header + banner + "\n")
    assert verdict.category is category


def test_a_ray_train_summary_yields_to_the_workers_own_error() -> None:
    log = ("(RayTrainWorker pid=4121, ip=10.0.3.7) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
           "2.00 GiB\nray.train.v2.api.exceptions.WorkerGroupError: Training failed due to worker errors:\n")
    assert explain(log).category is Category.GPU_MEMORY_OOM
    alone = explain("ray.tune.error.TuneError: ('Trials did not complete', [TorchTrainer_8f3a2_00000])\n")
    assert alone.category is Category.OTHER


def test_an_external_key_value_store_is_a_service_not_the_fabric_between_ranks() -> None:
    verdict = explain("redis.exceptions.ConnectionError: Error 111 connecting to redis-master.data.svc.cluster.local"
                      ":6379. Connection refused.\n")
    assert (verdict.category, verdict.rule) == (Category.OTHER, "python.external-service")


def test_a_ray_health_check_that_retries_is_no_fault_but_a_dead_node_is() -> None:
    retry = ("[2025-09-14 03:12:43,820 W 4187 4187] (gcs_server) gcs_health_check_manager.cc:108: Health check failed "
             "for node ac59e9f143, status: RpcError: RPC Error message: failed to connect to all addresses\n")
    assert explain(retry).category is None
    dead = explain(retry + "[2025-09-14 03:12:45,880 W 4187 4187] (gcs_server) gcs_health_check_manager.cc:83: Node is "
                   "dead because the health check failed.\n")
    assert dead.category is Category.INFRA_K8S
