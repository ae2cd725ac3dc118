"""Storage behind the job: the store that failed is the root, a request the store refused is the user's.

Cases from the audit of the object-store SDKs (botocore, s3transfer, google-cloud-storage, gcsfs,
azure-storage-blob), the parallel file systems' clients (Storage Scale, CephFS, BeeGFS, DAOS) and
the data/checkpoint readers (Arrow, Orbax, transformers).
"""

from __future__ import annotations

import pytest

from kcover import Action, Category, explain

TRACE = "Traceback (most recent call last):\n  File \"/workspace/train.py\", line 88, in <module>\n    save(state)\n"


@pytest.mark.parametrize(
    "line",
    [
        "botocore.exceptions.FlexibleChecksumError: Expected checksum 3Tx+qA== did not match calculated checksum: "
        "vN0c1w==",
        "azure.core.exceptions.HttpResponseError: The server is busy.",
        "google.api_core.exceptions.RetryError: Timeout of 120.0s exceeded, last exception: 503 POST "
        "https://storage.googleapis.com/upload/storage/v1/b/ckpt/o?uploadType=resumable: Backend Error",
        "pyarrow.lib.ArrowInvalid: Parquet magic bytes not found in footer. Either the file is corrupted or this is "
        "not a parquet file.",
    ],
    ids=["s3-checksum", "azure-busy", "gcs-retry-error", "parquet-truncated"],
)
def test_a_failing_store_or_damaged_file_is_storage_not_the_users_exception(line: str) -> None:
    verdict = explain(TRACE + line + "\n")
    assert verdict.category is Category.STORAGE_IO, verdict.rule


@pytest.mark.parametrize(
    "line",
    [
        "botocore.errorfactory.NoSuchBucket: An error occurred (NoSuchBucket) when calling the ListObjectsV2 "
        "operation: The specified bucket does not exist",
        "botocore.exceptions.NoCredentialsError: Unable to locate credentials",
    ],
    ids=["no-such-bucket", "no-credentials"],
)
def test_a_request_the_store_refused_fails_fast_as_the_users(line: str) -> None:
    verdict = explain(TRACE + line + "\n")
    assert (verdict.category, verdict.action) == (Category.USER_CODE, Action.FAIL)


def test_a_parallel_file_system_that_expels_the_client_is_storage() -> None:
    verdict = explain("Sun Jan 12 10:50:18.930 2025: [N] This node (gpu-node-a17) is being expelled because of an "
                      "expired lease. Pings sent: 60. Replies received: 0.\n"
                      "Sun Jan 12 10:50:21.004 2025: Lost membership in cluster gpfs-prod. Unmounting file systems.\n"
                      "OSError: [Errno 116] Stale file handle: '/gpfs/ckpt/run42'\n")
    assert verdict.category is Category.STORAGE_IO


@pytest.mark.parametrize(
    "text",
    [
        "DEBUG:s3fs:Client error (maybe retryable): An error occurred (SlowDown) when calling the PutObject "
        "operation: Please reduce your request rate.\nstep 41 loss 1.92\n",
        "WARNING:datasets.packaged_modules.parquet.parquet:Skipping bad file '/mnt/data/c4/train-00417.parquet'. "
        "ArrowInvalid: Parquet magic bytes not found in footer.\nstep 41 loss 1.92\n",
    ],
    ids=["s3fs-retry", "datasets-skips-bad-file"],
)
def test_what_the_client_retried_or_skipped_is_no_fault(text: str) -> None:
    assert explain(text).category is None
