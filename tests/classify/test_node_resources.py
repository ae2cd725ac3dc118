"""A node description whose allocatable GPUs are below its capacity is a verdict; equal counts are not.

``kubectl describe node`` (Capacity, then Allocatable), ``kubectl get node -o yaml`` and ``-o json``
(allocatable first) are read; the verdict's evidence is the line that completed the pair, at its
own line number.  The hostile side: equal counts, counts of two different nodes, a count outside
its block, ``Allocated resources:``, a header split from its counts by a block boundary, endless
distinct resource names, a 1 MiB line.
"""

from __future__ import annotations

import io
import json

from kcover.collect.lines import read_blocks
from kcover.collect.node_resources import MAX_COUNTS, TAIL_READ_BYTES, _NodeResources, read_node_resources
from kcover.explain import explain
from kcover.faults import Category

DESCRIBE = """\
Name:               gpu-node-7
Roles:              <none>
Capacity:
  cpu:                        128
  ephemeral-storage:          7441183616Ki
  memory:                     2113276288Ki
  nvidia.com/gpu:             {capacity}
  pods:                       110
Allocatable:
  cpu:                        128
  ephemeral-storage:          6857794809152
  memory:                     2062682496Ki
  nvidia.com/gpu:             {allocatable}
  pods:                       110
System Info:
  Machine ID:                 0123
Allocated resources:
  Resource           Requests      Limits
  --------           --------      ------
  nvidia.com/gpu     0             0
"""

NODE_YAML = """\
  status:
    allocatable:
      cpu: "48"
      memory: 263412492Ki
      nvidia.com/gpu: "{allocatable}"
      pods: "110"
    capacity:
      cpu: "48"
      memory: 263514892Ki
      nvidia.com/gpu: "{capacity}"
      pods: "110"
    conditions:
    - type: Ready
"""


def noted(text: str) -> str:
    return b"".join(read_node_resources(read_blocks(io.BytesIO(text.encode())))).decode()


def test_describe_node_with_a_gpu_withdrawn_blames_the_node_gpu() -> None:
    text = DESCRIBE.format(capacity=8, allocatable=7)
    verdict = explain(text)
    assert verdict.category is Category.GPU_HARDWARE
    assert verdict.rule == "gpu.unallocatable"
    assert verdict.node_at_fault
    assert verdict.root is not None
    evidence = verdict.root.evidence
    assert evidence.line_number == 13
    assert "nvidia.com/gpu:             7" in evidence.line
    assert "(kcover: node gpu-node-7: allocatable nvidia.com/gpu 7 < capacity 8)" in evidence.line
    assert verdict.nodes == ("gpu-node-7",)


def test_node_yaml_offering_no_gpu_is_the_device_plugins_failure() -> None:
    verdict = explain(NODE_YAML.format(capacity=16, allocatable=0))
    assert verdict.category is Category.INFRA_K8S
    assert verdict.rule == "k8s.gpus-not-advertised"
    assert verdict.node_at_fault


def test_node_json_is_read_like_yaml() -> None:
    status = {"status": {"allocatable": {"cpu": "8", "amd.com/gpu": "6"}, "capacity": {"amd.com/gpu": "8"}}}
    verdict = explain(json.dumps(status, indent=2))
    assert verdict.rule == "gpu.unallocatable"


def test_equal_counts_change_nothing() -> None:
    for text in (DESCRIBE.format(capacity=8, allocatable=8), NODE_YAML.format(capacity=4, allocatable=4)):
        assert noted(text) == text
        assert explain(text).category is None


def test_each_node_is_compared_with_its_own_counts() -> None:
    healthy = DESCRIBE.format(capacity=8, allocatable=8)
    broken = DESCRIBE.format(capacity=4, allocatable=3)
    text = noted(healthy + broken + healthy)
    assert text.count("(kcover:") == 1
    assert "allocatable nvidia.com/gpu 3 < capacity 4" in text
    assert text.splitlines()[len(healthy.splitlines()) + 12].endswith("capacity 4)")


def described(name: str, capacity: int, allocatable: int, pods: int = 40) -> str:
    """A node's ``kubectl describe`` text with its pods' table (about 5 KB)."""
    row = "  default   job-{name}-{i:03d}-worker   8 (6%)   8 (6%)   64Gi (3%)   64Gi (3%)   {i}d\n"
    table = "".join(row.format(name=name, i=i) for i in range(pods))
    head = DESCRIBE.format(capacity=capacity, allocatable=allocatable).replace("gpu-node-7", name)
    return head.replace("Allocated resources:", "Non-terminated Pods:\n" + table + "Allocated resources:")


def test_a_cluster_of_healthy_nodes_over_many_blocks_gets_no_note() -> None:
    nodes = "".join(described(f"gpu-{i:04d}", 8 >> (i % 3), 8 >> (i % 3)) for i in range(600))
    assert len(nodes) > 2 << 20  # several 1 MiB blocks, pairs cut at their ends
    assert "(kcover:" not in noted(nodes)
    assert explain(nodes).category is None


def test_the_one_broken_node_of_a_cluster_is_named() -> None:
    nodes = [described(f"gpu-{i:04d}", 8, 8) for i in range(600)]
    nodes[417] = described("gpu-0417", 8, 5)
    verdict = explain("".join(nodes))
    assert verdict.rule == "gpu.unallocatable"
    assert verdict.nodes == ("gpu-0417",)
    assert "".join(noted(node) for node in nodes).count("(kcover:") == 1


def test_counts_of_a_partial_paste_pair_with_nothing_after_it() -> None:
    grep = "$ kubectl describe node gpu-small | grep -A4 Allocatable\nAllocatable:\n  cpu: 64\n  nvidia.com/gpu: 4\n"
    assert "(kcover:" not in noted(grep + described("gpu-big", 8, 8))
    fragment = 'capacity:\n  cpu: "96"\n  nvidia.com/gpu: "8"\n'
    assert "(kcover:" not in noted(fragment + NODE_YAML.format(capacity=4, allocatable=4))


def test_mig_and_shared_gpu_resources_are_compared_too() -> None:
    for resource in ("nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared"):
        text = f"Capacity:\n  {resource}:  7\nAllocatable:\n  {resource}:  6\n"
        assert f"allocatable {resource} 6 < capacity 7" in noted(text)


def test_a_count_outside_its_block_is_not_the_blocks() -> None:
    text = "Capacity:\n  nvidia.com/gpu: 8\nConditions:\n  nvidia.com/gpu: 2\nAllocatable:\n  cpu: 4\n"
    assert noted(text) == text
    text = "Allocatable: 3\n  nvidia.com/gpu: 2\nCapacity:\n  nvidia.com/gpu: 8\n"  # not a block header
    assert noted(text) == text


def test_a_header_at_the_end_of_one_block_opens_its_counts_in_the_next() -> None:
    first = b"filler line\n" * 1000 + b"Capacity:\n"
    second = b"  nvidia.com/gpu: 8\nAllocatable:\n  nvidia.com/gpu: 5\n"
    out = b"".join(read_node_resources([first, second]))
    assert out.endswith(b"  nvidia.com/gpu: 5  (kcover: allocatable nvidia.com/gpu 5 < capacity 8)\n")
    assert out.count(b"\n") == (first + second).count(b"\n")


def test_endless_distinct_resource_names_keep_memory_bounded() -> None:
    reader = _NodeResources()
    block = "Capacity:\n" + "".join(f"  huawei.com/Ascend{index:06d}: 8\n" for index in range(5000))
    assert reader.read(block.encode()) == block.encode()
    assert len(reader.counts) <= MAX_COUNTS


def test_a_huge_line_passes_unchanged() -> None:
    text = "Capacity:\n  nvidia.com/gpu: " + "9" * (1 << 20) + "\nAllocatable:\n  nvidia.com/gpu: 1\n"
    assert noted(text) == text


def test_prefixed_lines_are_read_past_their_prefix() -> None:
    text = DESCRIBE.format(capacity=8, allocatable=6)
    for prefix in ("2024-05-01T10:00:00.123456789Z stdout F ", "[pod/gpu-check/main] ", "> "):
        verdict = explain("".join(prefix + line + "\n" for line in text.splitlines()))
        assert verdict.rule == "gpu.unallocatable", prefix


def test_scheduler_lines_naming_capacity_are_no_counts() -> None:
    line = (
        "Warning  OutOfnvidia.com/gpu  3s  kubelet  Node didn't have enough resource: nvidia.com/gpu,"
        " requested: 8, used: 0, capacity: 7\n"
    )
    text = "Capacity:\n" + line * 200 + "Allocatable:\n  nvidia.com/gpu: 2\n"
    assert "(kcover:" not in noted(text)


def test_a_block_read_whole_is_not_read_again_at_the_next() -> None:
    """The end of a block that was read is not re-read: a node's allocatable count would pair with the next node's."""
    for pods in range(30, 90):
        first = described("gpu-a", 2, 2, pods).encode()
        tail = first[first.rfind(b"\n", 0, len(first) - TAIL_READ_BYTES) + 1 :]
        if b"nvidia.com/gpu:             2\n  pods" in tail and b"Capacity:" not in tail:
            break
    else:
        raise AssertionError("no pod count puts a block's end between a node's two counts")
    second = described("gpu-b", 8, 8).encode()
    assert b"(kcover:" not in b"".join(read_node_resources([first, second]))


def test_a_fragment_after_a_named_node_is_not_given_that_name() -> None:
    fragment = 'status:\n  allocatable:\n    nvidia.com/gpu: "3"\n  capacity:\n    nvidia.com/gpu: "4"\n'
    text = noted(described("gpu-named", 8, 8) + fragment)
    assert "(kcover: allocatable nvidia.com/gpu 3 < capacity 4)" in text
