"""GPU libraries under the job: their CUDA failures are CUDA's, not the user's Python exception.

Cases from the audit of flash-attention, xformers, bitsandbytes, apex, TransformerEngine, the
DeepSpeed op builder, torch's cpp_extension, Triton, CuPy, TensorRT and vLLM: the libraries wrap
CUDA, cuBLAS and cuDNN failures in RuntimeError/ValueError lines that the generic exception
rule would read as the program's own bug.
"""

from __future__ import annotations

import pytest

from kcover import Action, Category, explain

TRACE = "Traceback (most recent call last):\n  File \"/workspace/train.py\", line 88, in <module>\n    step(batch)\n"


@pytest.mark.parametrize(
    "line",
    [
        "ValueError: Free memory on device (6.9/79.19 GiB) on startup is less than desired GPU memory utilization "
        "(0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
        "cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 4,294,967,296 bytes (allocated so far: "
        "73,014,444,032 bytes).",
        "RuntimeError: /opt/transformer_engine/transformer_engine/common/gemm/cublaslt_gemm.cu:52 in function "
        "CreateCublasHandle: cuBLAS Error: the resource allocation failed",
    ],
    ids=["vllm-startup", "cupy-pool", "te-cublas-alloc"],
)
def test_a_librarys_out_of_memory_is_gpu_memory(line: str) -> None:
    assert explain(TRACE + line + "\n").category is Category.GPU_MEMORY_OOM


def test_a_librarys_cuda_status_is_cudas_not_the_programs() -> None:
    line = ("RuntimeError: /opt/transformer_engine/transformer_engine/common/gemm/cublaslt_gemm.cu:543 "
            "in function cublas_gemm: cuBLAS Error: the GPU program failed to execute\n")
    verdict = explain(TRACE + line)
    assert verdict.category is Category.CUDA_SOFTWARE


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: PyTorch version mismatch! DeepSpeed ops were compiled and installed with a different version "
        "than what is being used at runtime. Please re-install DeepSpeed or switch torch versions.",
        "CUDA SETUP: Required library version not found: libbitsandbytes_cuda122.so. Maybe you need to compile it "
        "from source?",
    ],
    ids=["deepspeed-ops", "bitsandbytes-binary"],
)
def test_an_extension_built_for_another_cuda_fails_fast(line: str) -> None:
    verdict = explain(TRACE + line + "\n")
    assert (verdict.category, verdict.rule, verdict.action) == (
        Category.CUDA_SOFTWARE, "cuda.extension-mismatch", Action.FAIL)


def test_a_minor_cuda_version_warning_is_no_fault() -> None:
    warning = ("/usr/local/lib/python3.10/dist-packages/torch/utils/cpp_extension.py:414: UserWarning: The "
               "detected CUDA version (12.4) has a minor version mismatch with the version that was used to "
               "compile PyTorch (12.1). Most likely this shouldn't be a problem.\nstep 10 loss 2.1\n")
    assert explain(warning).category is None
