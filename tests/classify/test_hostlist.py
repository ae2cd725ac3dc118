"""Slurm host lists and comma-separated node lists expand into the nodes they stand for, or none."""

from __future__ import annotations

import time

import pytest

from kcover.collect.hostlist import MAX_NODES, expand


@pytest.mark.parametrize(
    ("word", "nodes"),
    [
        ("gpu-a05", ("gpu-a05",)),
        ("gpu-[01-03]", ("gpu-01", "gpu-02", "gpu-03")),
        ("gpu-[8-10]", ("gpu-8", "gpu-9", "gpu-10")),  # as wide as the range's first number
        ("gpu-[098-101]", ("gpu-098", "gpu-099", "gpu-100", "gpu-101")),
        ("gpu-[01-02,07]-ib", ("gpu-01-ib", "gpu-02-ib", "gpu-07-ib")),
        ("rack[1-2]-n[1-2]", ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2")),
        ("gpu-[01-02],cpu-7,gpu-01", ("gpu-01", "gpu-02", "cpu-7")),  # a repeat is named once
        ("node-1,node-2", ("node-1", "node-2")),
    ],
)
def test_a_host_list_stands_for_each_of_its_nodes(word: str, nodes: tuple[str, ...]) -> None:
    assert expand(word) == nodes


@pytest.mark.parametrize(
    "word",
    [
        "gpu-[03-01]",  # a range that runs backwards
        "gpu-[01-02",  # unclosed
        "gpu-01]",
        "gpu-[a-b]",  # not numbers
        "gpu-[]",
        "node-1,,node-2",  # an empty item
        "gpu-[0-99999999999]",  # far more nodes than a failure names: a partition
        f"gpu-[1-{MAX_NODES + 1}]",
        "r[1-9]-n[1-9]",  # 81 together
        ",".join(f"n{number}" for number in range(MAX_NODES + 1)),
        "gpu 01",  # not a host name
        "a" * 254,
        "a" + "[1]" * 300,  # every part valid, but the name it makes is longer than a host name
    ],
)
def test_what_is_no_valid_short_host_list_names_no_node(word: str) -> None:
    assert expand(word) == ()


def test_a_list_of_many_ranges_is_refused_without_counting_them_all() -> None:
    word = "gpu-[" + ",".join(["0-99999999999"] * 60) + "]"
    started = time.perf_counter()
    assert expand(word) == ()
    assert time.perf_counter() - started < 0.5
