"""A line that names the failed node blames that node, not the node whose log holds the line.

A scheduler's or control plane's report about another node (Slurm's "Node
failure on gpu-a05" in the batch host's log, ``kubectl get nodes`` pasted in a
job's log) names the node to exclude; a pattern marks it with ``(?P<node>…)``.
A rule with ``only_named_node`` blames no node when its line names none: the
node whose log holds the line is the healthy one that reported.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcover import Action, Category
from kcover.classify.attribution import attribute
from kcover.classify.collector import FaultCollector
from kcover.classify.fallback import fallback_faults
from kcover.classify.matcher import default_matcher
from kcover.collect.sources import SourceInfo
from kcover.explain import scan_stream
from kcover.faults import Verdict

STEPS = "".join(f"step {i} loss 2.{i}\n" for i in range(5))


def _verdict(text: str, node: str | None = "batch-host-1", name: str = "job.log") -> Verdict:
    collector = FaultCollector()
    scan_stream(default_matcher(), io.BytesIO(text.encode()), SourceInfo(name=name, node=node), collector)
    return attribute(collector.faults, tails=collector.tails)


@pytest.mark.parametrize(
    ("line", "node"),
    [
        ("srun: error: Node failure on gpu-a05", "gpu-a05"),
        ("srun: error: Node failure on gpu-a05.cluster.local.", "gpu-a05.cluster.local"),
        ("slurmstepd: error: *** STEP 4412.0 STEPD TERMINATED ON gpu-a07 AT 2025-02-11T03:14:07 DUE TO JOB NOT "
         "ENDING WITH SIGNALS ***", "gpu-a07"),
        ("srun: error: Task launch for StepId=4412.0 failed on node gpu-a09: Communication connection failure",
         "gpu-a09"),
        ("srun: Prolog hung on node gpu-a11", "gpu-a11"),
        ("=>> PBS: job killed: node 18 (n314) requested job terminate, 'EOF' (code 1099)", "n314"),
    ],
)
def test_a_scheduler_line_blames_the_node_it_names_not_the_batch_host(line: str, node: str) -> None:
    verdict = _verdict(STEPS + line + "\n")
    assert verdict.root is not None and verdict.root.rule in ("slurm.node-failure", "pbs.node-failure")
    assert verdict.nodes == (node,)
    assert verdict.action is Action.RESTART_EXCLUDING_NODES


@pytest.mark.parametrize(
    "line",
    [
        "slurmstepd: error: *** JOB 4412 ON gpu-a03 CANCELLED AT 2025-02-11T03:14:07 DUE TO NODE FAILURE, SEE "
        "SLURMCTLD LOG FOR DETAILS ***",
        "   JobState=NODE_FAIL Reason=NodeDown Dependency=(null)",
    ],
)
def test_a_scheduler_line_that_names_no_failed_node_blames_none(line: str) -> None:
    # "ON gpu-a03" is the batch host, where the job ran its script: not the node that failed
    verdict = _verdict(STEPS + line + "\n")
    assert verdict.root is not None and verdict.root.rule == "slurm.node-failure"
    assert verdict.nodes == ()
    assert not verdict.node_at_fault
    assert verdict.action is Action.RESTART


TABLE = (
    "NAME          STATUS     ROLES    AGE   VERSION\n"
    "gpu-node-3    Ready      <none>   41d   v1.29.4\n"
    "gpu-node-17   NotReady   <none>   41d   v1.29.4\n"
    "gpu-node-21   Ready      <none>   41d   v1.29.4\n"
)


def test_a_pasted_kubectl_table_blames_its_not_ready_row() -> None:
    verdict = _verdict(TABLE, node=None)  # a pasted log: no node known for its source
    assert verdict.category is Category.INFRA_K8S
    assert verdict.nodes == ("gpu-node-17",)
    both = _verdict(TABLE.replace("gpu-node-21   Ready   ", "gpu-node-21   NotReady"), node=None)
    assert both.nodes == ("gpu-node-17", "gpu-node-21")  # lines alike but for the node are two faults
    old_kubectl = _verdict("docker3005.se.example.net   NotReady   18h       v1.7.0\n", node=None)
    assert old_kubectl.nodes == ("docker3005.se.example.net",)  # kubectl < 1.8 has no ROLES column


def test_a_workers_log_naming_another_node_blames_the_workers_own_node() -> None:
    # a job's log is the job's text: a line in it must not move another node's pods (it did blame its own before)
    assert _verdict(TABLE, node="gpu-node-3").nodes == ("gpu-node-3",)
    named = _verdict("Normal   NodeNotReady  2m  kubelet  Node gpu-node-9 status is now: NodeNotReady\n",
                     node="gpu-node-4")
    assert named.nodes == ("gpu-node-4",)
    assert _verdict("Normal   NodeNotReady  2m  kubelet  Node gpu-node-9 status is now: NodeNotReady\n",
                    node=None).nodes == ("gpu-node-9",)


@pytest.mark.parametrize("line", ["Status   NotReady\n", "raylet   NotReady   since 12:00\n"])
def test_a_not_ready_line_that_is_no_kubectl_row_names_no_node(line: str) -> None:
    verdict = _verdict(line, node=None)
    assert verdict.root is not None and verdict.root.rule == "k8s.node-lost"
    assert verdict.nodes == ()


def test_a_not_ready_sign_that_names_no_node_blames_the_node_whose_log_holds_it() -> None:
    verdict = _verdict("May 14 03:14:40 gpu-node-a17 systemd[1]: kubelet.service: Main process exited, "
                       "code=exited, status=1/FAILURE\n", node="gpu-node-a17")
    assert verdict.nodes == ("gpu-node-a17",)


@pytest.mark.parametrize(
    "line",
    [
        "srun: error: Node failure on gpu-[01-99]",  # more nodes than one job's failure blames: a partition
        "srun: error: Node failure on gpu-[01-02",  # no valid host list
        "srun: error: Task launch for StepId=4412.3 failed on node gpu-a05: Job credential revoked",
        "srun: error: Task launch for StepId=4412.3 failed on node gpu-a05: No such file or directory",
    ],
)
def test_a_long_or_broken_host_list_or_a_launch_refused_for_the_jobs_own_reasons_blames_no_node(line: str) -> None:
    verdict = _verdict(STEPS + line + "\n")
    assert verdict.root is not None and verdict.root.rule == "slurm.node-failure"
    assert verdict.nodes == () and verdict.action is Action.RESTART


@pytest.mark.parametrize(
    ("line", "nodes"),
    [
        ("srun: error: Node failure on gpu-[01-02]", ("gpu-01", "gpu-02")),
        ("srun: error: Node failure on gpu-[01-02,07],cpu-3.", ("gpu-01", "gpu-02", "gpu-07", "cpu-3")),
        ("srun: error: Node failure on rack[1-2]-n[8-9]", ("rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9")),
        ("Workload was evicted as there was no replacement for unhealthy node(s): node-1,node-2",
         ("node-1", "node-2")),
    ],
)
def test_a_host_list_blames_each_of_its_nodes(line: str, nodes: tuple[str, ...]) -> None:
    verdict = _verdict(STEPS + line + "\n", node=None)
    assert verdict.nodes == nodes
    assert verdict.node_at_fault and verdict.action is Action.RESTART_EXCLUDING_NODES


def test_a_host_list_cut_by_the_line_length_limit_names_no_node() -> None:
    names = ",".join(f"gpu-{number:03d}" for number in range(200))  # 1,599 characters: past what is read
    assert _verdict(STEPS + "srun: error: Node failure on " + names + "\n").nodes == ()


def test_trailing_punctuation_is_no_part_of_the_name() -> None:
    assert _verdict("srun: error: Node failure on gpu-a05-\n").nodes == ("gpu-a05",)


def test_several_failed_nodes_in_one_log_are_all_blamed_in_either_order() -> None:
    cancelled = ("slurmstepd: error: *** JOB 4412 ON gpu-a03 CANCELLED AT 2025-02-11T03:14:07 DUE TO NODE FAILURE, "
                 "SEE SLURMCTLD LOG FOR DETAILS ***\n")
    failures = "srun: error: Node failure on gpu-a05\nsrun: error: Node failure on gpu-a06\n"
    for text in (cancelled + failures, failures + cancelled):
        verdict = _verdict(STEPS + text)
        assert verdict.nodes == ("gpu-a05", "gpu-a06")
        assert verdict.node_at_fault and verdict.action is Action.RESTART_EXCLUDING_NODES


def test_two_sources_naming_two_failed_nodes_blame_both_once() -> None:
    collector = FaultCollector()
    matcher = default_matcher()
    for name, failed in (("a.log", "gpu-a05"), ("b.log", "gpu-a05"), ("c.log", "gpu-a06")):
        text = STEPS + f"srun: error: Node failure on {failed}\n"
        scan_stream(matcher, io.BytesIO(text.encode()), SourceInfo(name=name, node="batch"), collector)
    verdict = attribute(collector.faults, tails=collector.tails)
    assert verdict.nodes == ("gpu-a05", "gpu-a06")
    assert fallback_faults(collector.tails) == []  # the logs end in the named failure, nothing unexplained


@pytest.mark.parametrize("name", ["a" * (1 << 20), "a." * (1 << 19), "-" * (1 << 20)])
def test_a_megabyte_node_name_names_no_node_in_bounded_time(name: str) -> None:
    started = time.perf_counter()
    verdict = _verdict("srun: error: Node failure on " + name + "\n")
    assert time.perf_counter() - started < 20
    assert verdict.root is not None and verdict.root.rule == "slurm.node-failure"
    assert verdict.nodes == ()  # longer than any host name (253): no node is named
    kubectl = _verdict(name + "   NotReady   <none>   41d   v1.29.4\n", node=None)
    assert time.perf_counter() - started < 40
    assert kubectl.nodes == ()


RULE = """
rules:
  - id: my.rule
    title: mine
    category: infra_k8s
    severity: fatal
    retriable: true
    node_at_fault: {node_at_fault}
    role: root
    remediation: fix it
    patterns: [{pattern}]
{extra}"""


def _explain(tmp_path: Path, pattern: str, extra: str = "", node_at_fault: str = "true",
             log: str = "machine gpu-9 died\n") -> subprocess.CompletedProcess[str]:
    catalog = tmp_path / "mine.yaml"
    catalog.write_text(RULE.format(pattern=pattern, extra=extra, node_at_fault=node_at_fault), encoding="utf-8")
    path = tmp_path / "x.log"
    path.write_text(log, encoding="utf-8")
    return subprocess.run([sys.executable, "-m", "kcover", "explain", "--json", "--catalog", str(catalog),
                           str(path)], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    ("pattern", "extra", "node_at_fault", "words"),
    [
        ("'machine (?P<host>\\S+) died'", "", "true", "named group other than (?P<node>"),
        ("'machine \\S+ died'", "    only_named_node: true\n", "true", "'only_named_node'"),
        ("'machine (?P<node>\\S+) died'", "    only_named_node: true\n", "false", "node_at_fault: true"),
        ("'machine (?P<node>\\S+) died'", "    only_named_node: true\n    exit_codes: [3]\n", "true",
         "no reasons or exit_codes"),
    ],
    ids=["other-group", "nothing-named", "blames-nobody", "exit-code"],
)
def test_a_catalog_that_misuses_the_node_group_is_refused_in_one_line(
    tmp_path: Path, pattern: str, extra: str, node_at_fault: str, words: str
) -> None:
    done = _explain(tmp_path, pattern, extra, node_at_fault)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "'my.rule'" in done.stderr and words in done.stderr


def test_a_user_rule_names_the_node_its_line_names(tmp_path: Path) -> None:
    done = _explain(tmp_path, "'machine (?P<node>[\\w.-]{1,64}) died'", "    only_named_node: true\n")
    assert done.returncode == 1, done.stderr  # a fatal fault was found
    document = json.loads(done.stdout)["verdict"]
    assert document["rule"] == "my.rule"
    assert document["nodes"] == ["gpu-9"]
    assert document["action"] == "restart_excluding_nodes"
