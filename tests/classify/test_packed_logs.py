"""Compressed logs and archives of logs: read as their text, damage named, nothing read twice or lost.

Real files made with the real tools' formats (Python's gzip, bz2, lzma, tarfile
and zipfile write what gzip, bzip2, xz, tar and zip write); the hostile cases a
user meets: a gzip cut mid-copy, a corrupted byte, a truncated support bundle, a
decompression bomb, an archive in an archive, a zip on a pipe, file names that
are terminal escapes or climb out of the archive, a FIFO in place of a file.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from kcover.collect import packed
from kcover.explain import explain_paths, read_paths

XID = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.\n"
OOM = b"RuntimeError: CUDA error: out of memory\n"
HEALTHY = b"step 1 loss 2.0\nNCCL INFO Bootstrap : Using eth0\n"
CRI_XID = b"2026-12-01T10:00:00.000000000Z stderr F " + XID


def _tar(path: Path, members: dict[str, bytes], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data in members.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(data)
            tar.addfile(entry, io.BytesIO(data))
    return path


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress], ids=["gzip", "bzip2", "xz"])
def test_a_compressed_log_gives_the_verdict_of_its_text(tmp_path: Path, compress: object) -> None:
    assert callable(compress)
    plain = tmp_path / "plain" / "rank3.log"
    plain.parent.mkdir()
    plain.write_bytes(b"step 1\n" * 5000 + XID)
    packed_log = tmp_path / "rank3.log.packed"
    packed_log.write_bytes(compress(plain.read_bytes()))
    want, got = explain_paths([plain]), explain_paths([packed_log])
    assert got.root is not None and want.root is not None
    assert (got.root.rule, got.ranks, got.warnings) == (want.root.rule, want.ranks, ())
    assert got.root.evidence.line_number == want.root.evidence.line_number == 5001


def test_the_first_bytes_decide_never_the_name(tmp_path: Path) -> None:
    looks_plain = tmp_path / "worker.log"
    looks_plain.write_bytes(gzip.compress(XID))
    looks_packed = tmp_path / "worker2.log.gz"
    looks_packed.write_bytes(OOM)
    starts_like_bzip2 = tmp_path / "worker3.log"  # "BZh9" without bzip2's block magic is text
    starts_like_bzip2.write_bytes(b"BZh9 is a tag, not a header\n" + OOM)
    assert [explain_paths([path]).category for path in (looks_plain, looks_packed, starts_like_bzip2)] == [
        "gpu_hardware", "gpu_memory_oom", "gpu_memory_oom"
    ]


def test_a_support_bundle_is_read_as_the_folder_it_packed(tmp_path: Path) -> None:
    members = {
        "bundle/node-1/rank1.log": HEALTHY,
        "bundle/node-7/rank3.log": b"ok\n" + XID,
        "bundle/node-7/rank2.log.gz": gzip.compress(b"ok\n" + OOM),  # a rotated log inside the bundle
    }
    for archive in (_tar(tmp_path / "bundle.tar.gz", members), _zip(tmp_path / "bundle.zip", members)):
        verdict = explain_paths([archive])
        assert verdict.category == "gpu_hardware"
        assert verdict.nodes == ("node-7",)
        sources = {fault.evidence.source: (fault.node, fault.rank) for fault in verdict.faults}
        assert sources == {  # a path given on the command line names its logs by that path
            f"{archive}:node-7/rank3.log": ("node-7", 3),
            f"{archive}:node-7/rank2.log.gz": ("node-7", 2),
        }
        assert explain_paths([tmp_path]).nodes == ("node-7",)  # in a folder: by the path below it
        assert {f.evidence.source for f in explain_paths([tmp_path]).faults} >= {f"{archive.name}:node-7/rank3.log"}
        assert verdict.warnings == ()


def test_an_archive_of_one_node_folder_keeps_the_node(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "logs.tar", {"node-7/rank3.log": XID}, mode="w")
    assert explain_paths([archive]).nodes == ("node-7",)


def test_kubelet_rotated_container_logs_in_a_bundle(tmp_path: Path) -> None:
    pod = "training_worker-3_0f4d2c1e-1111-2222-3333-444455556666/trainer"
    archive = _tar(tmp_path / "pods.tar.gz", {
        f"{pod}/0.log.20261201-101500.gz": gzip.compress(CRI_XID),
        f"{pod}/0.log": b"2026-12-01T10:16:00.000000000Z stdout F step 9\n",
    })
    verdict = explain_paths([archive])
    assert verdict.category == "gpu_hardware"
    assert verdict.root is not None
    assert verdict.root.evidence.source == f"{archive}:training/worker-3/trainer/0.log.20261201-101500.gz"


def test_a_gzip_cut_mid_copy_keeps_what_was_read_and_says_where_it_stopped(tmp_path: Path) -> None:
    after = b"".join(os.urandom(40).hex().encode() + b"\n" for _ in range(1000))  # 81 KB that will not shrink
    whole = gzip.compress(b"".join(b"step %d loss 1.0\n" % n for n in range(200_000)) + XID + after)
    cut = tmp_path / "rank0.log.gz"
    cut.write_bytes(whole[: len(whole) - 2000])  # the end never arrived
    verdict, read = read_paths([cut])
    assert read == 1
    assert verdict.category == "gpu_hardware"  # the Xid was before the cut
    [warning] = verdict.warnings
    assert warning.startswith(f"{cut}: gzip data cut short or damaged after line ")
    assert warning.endswith("; read up to there")
    stopped = int(warning.split("after line ")[1].split(" ")[0])
    assert 200_001 < stopped < 201_001


def test_a_corrupted_byte_is_damage_not_a_traceback(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(XID + b"".join(b"line %d\n" % n for n in range(100_000))))
    data[len(data) // 2] ^= 0xFF
    damaged = tmp_path / "rank0.log.gz"
    damaged.write_bytes(bytes(data))
    verdict, read = read_paths([damaged])
    assert (read, verdict.category) == (1, "gpu_hardware")
    assert len(verdict.warnings) == 1 and "cut short or damaged" in verdict.warnings[0]


def test_a_truncated_bundle_reads_the_logs_before_the_cut(tmp_path: Path) -> None:
    noise = os.urandom(400_000)  # incompressible, so the cut lands inside it
    whole = _tar(tmp_path / "whole.tar.gz", {"b/node-1/rank1.log": XID, "b/node-2/noise.bin": noise,
                                             "b/node-3/rank3.log": OOM})
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole.read_bytes()[:200_000])
    verdict, read = read_paths([cut])
    assert verdict.category == "gpu_hardware"
    assert read == 2  # rank1.log whole, noise.bin up to the cut; rank3.log never arrived
    assert len(verdict.warnings) == 2
    assert verdict.warnings[1] == (
        f"{cut}: gzip-compressed tar archive cut or damaged after 2 logs (Compressed file ended before the"
        " end-of-stream marker was reached); read up to there"
    )
    assert verdict.warnings[0].startswith(f"{cut}:node-2/noise.bin: archive member data cut short or damaged")


def test_formats_that_cannot_be_read_say_what_to_run(tmp_path: Path) -> None:
    zstd = tmp_path / "rank0.log.zst"
    zstd.write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(64))
    journal = tmp_path / "system.journal"
    journal.write_bytes(b"LPKSHHRH" + bytes(300))
    nested = _zip(tmp_path / "outer.zip", {"inner.tar": _tar(tmp_path / "inner.tar", {"a.log": XID}, "w").read_bytes()})
    verdict, read = read_paths([zstd, journal, nested])
    assert read == 0 and verdict.category is None
    assert list(verdict.warnings) == [
        f"{zstd}: compressed with zstd, which kcover cannot read: decompress it first"
        " (zstd -dc FILE | kcover explain), skipped",
        f"{journal}: a systemd journal file (binary): export it first"
        " (journalctl --file FILE -o short-iso | kcover explain), skipped",
        f"{nested}:inner.tar: an archive inside an archive: unpack it first, skipped",
    ]


def test_a_decompression_bomb_costs_time_not_memory(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.log.gz"
    line = b"step 1 loss 2.0 " * 60 + b"\n"
    with gzip.open(bomb, "wb") as out:
        for _ in range(256):  # 256 MiB of text from a file of a few hundred KB
            out.write(line * ((1 << 20) // len(line)))
        out.write(XID)
    assert bomb.stat().st_size < 2 << 20
    tiny = tmp_path / "tiny.log.gz"
    tiny.write_bytes(gzip.compress(XID))

    def peak_mib(log: Path) -> int:  # a fresh process each: its peak RSS is the scan's
        script = (
            "import resource, sys; from kcover.explain import explain_paths; "
            f"v = explain_paths([__import__('pathlib').Path({str(log)!r})]); "
            "print(v.category, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)"
        )
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300)
        category, peak = done.stdout.split()
        assert category == "gpu_hardware"
        return int(peak)

    baseline = peak_mib(tiny)  # the same process on 100 bytes (and the compiled catalog cached for the next)
    bomb_peak = peak_mib(bomb)
    assert bomb_peak < baseline + 32, (baseline, bomb_peak)  # 256 MiB held anywhere would show


def test_member_names_are_printable_and_never_leave_the_archive(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "evil.tar.gz", {"../../outside/rank1.log": XID, "\x1b[31mred\x1b[0m.log": HEALTHY})
    before = set(tmp_path.parent.rglob("*"))
    verdict = explain_paths([archive])
    assert set(tmp_path.parent.rglob("*")) == before  # nothing unpacked anywhere
    assert verdict.root is not None and verdict.root.evidence.source == f"{archive}:outside/rank1.log"
    assert verdict.nodes == ("outside",)  # never ".." or "/"
    with tarfile.open(tmp_path / "links.tar", "w") as tar:  # links, devices and folders are not logs
        for kind, name in ((tarfile.SYMTYPE, "to-passwd"), (tarfile.CHRTYPE, "tty"), (tarfile.DIRTYPE, "dir")):
            entry = tarfile.TarInfo(name)
            entry.type, entry.linkname = kind, "/etc/passwd"
            tar.addfile(entry)
    assert read_paths([tmp_path / "links.tar"])[1] == 0


def test_a_member_named_only_dots_or_slashes_is_read_and_the_rest_too(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "odd.tar", {"..": OOM, "node-1/rank1.log": XID}, mode="w")
    verdict, read = read_paths([archive])
    assert (read, verdict.category, verdict.warnings) == (2, "gpu_hardware", ())
    assert {fault.evidence.source for fault in verdict.faults} == {f"{archive}:unnamed", f"{archive}:node-1/rank1.log"}


def test_escapes_in_a_member_name_are_shown_escaped(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "logs.zip", {"\x1b]0;pwned\x07rank1.log": XID})
    verdict = explain_paths([archive])
    assert verdict.root is not None
    assert verdict.root.evidence.source == f"{archive}:\\x1b]0;pwned\\x07rank1.log"


def test_an_encrypted_zip_member_is_named_and_the_others_read(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "logs.zip", {"secret.log": OOM, "rank1.log": XID})
    data = bytearray(archive.read_bytes())
    local = data.find(b"PK\x03\x04")  # mark the first member encrypted, in both of its headers
    central = data.find(b"PK\x01\x02")
    data[local + 6] |= 1
    data[central + 8] |= 1
    archive.write_bytes(bytes(data))
    verdict = explain_paths([archive])
    assert verdict.category == "gpu_hardware"
    assert len(verdict.warnings) == 1
    assert verdict.warnings[0].startswith(f"{archive}:secret.log: cannot be read (")
    assert "encrypted" in verdict.warnings[0]


def test_too_many_logs_in_one_archive_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packed, "MAX_ARCHIVE_LOGS", 3)
    members = {f"rank{n}.log": HEALTHY for n in range(5)}
    for archive in (_tar(tmp_path / "many.tar.gz", members), _zip(tmp_path / "many.zip", members)):
        verdict, read = read_paths([archive])
        assert read == 3
        assert list(verdict.warnings) == [
            f"{archive}: more than 3 logs or 65536 entries in one archive, the rest skipped"
        ]


def test_a_fifo_of_gzip_is_read_and_a_fifo_of_zip_is_named(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    for payload, want in ((gzip.compress(XID), "gpu_hardware"), (_zip(tmp_path / "z.zip", {"a.log": XID}), None)):
        os.mkfifo(fifo)
        data = payload if isinstance(payload, bytes) else payload.read_bytes()
        writer = threading.Thread(target=lambda data=data: fifo.write_bytes(data))
        writer.start()
        verdict, read = read_paths([fifo])
        writer.join(timeout=10)
        assert verdict.category == want
        if want is None:
            assert read == 0
            assert list(verdict.warnings) == [
                f"{fifo}: a zip archive cannot be read from a pipe: give its path, skipped"
            ]
        fifo.unlink()


def test_tiny_and_empty_files_are_text(tmp_path: Path) -> None:
    for name, data in (("empty.log", b""), ("one.log", b"\x1f"), ("two.log", b"PK")):
        (tmp_path / name).write_bytes(data)
        verdict, read = read_paths([tmp_path / name])
        assert (read, verdict.category, verdict.warnings) == (1, None, ())


def _cri(*lines: str) -> bytes:
    return b"".join(f"2026-12-01T10:00:{n:02d}.000000000Z stderr F {line}\n".encode() for n, line in enumerate(lines))


def test_a_kubelet_log_and_its_rotated_files_are_one_stream(tmp_path: Path) -> None:
    folder = tmp_path / "training_worker-3_0f4d2c1e-1111-2222-3333-444455556666" / "trainer"
    folder.mkdir(parents=True)
    caught = ("CRITICAL:trainer:widget frobnication stalled", "retrying in 5 s")
    (folder / "0.log.20261201-090000.gz").write_bytes(gzip.compress(_cri("step 1", "step 2")))
    (folder / "0.log.20261201-101500").write_bytes(_cri("step 3", caught[0]))  # the next line was in 0.log
    (folder / "0.log").write_bytes(_cri(caught[1], XID.decode().strip()))
    alone = explain_paths([folder / "0.log.20261201-101500"])
    assert alone.category == "other"  # read on its own, its last line passes for the log's last words
    verdict, read = read_paths([tmp_path])
    assert read == 3
    assert verdict.category == "gpu_hardware"
    assert verdict.root is not None
    evidence = verdict.root.evidence
    assert (evidence.source, evidence.line_number) == ("training/worker-3/trainer/0.log", 6)  # 2 + 2 + 2
    (folder / "0.log").write_bytes(_cri(caught[1], "step 4"))
    assert explain_paths([tmp_path]).category is None  # the middle of the log, not its end
    (folder / "0.log").unlink()  # rotated files without their log: each read on its own
    names = {fault.evidence.source for fault in explain_paths([tmp_path]).faults}
    assert names == {"training/worker-3/trainer/0.log.20261201-101500"}


def test_hostile_archives_are_named_never_a_traceback(tmp_path: Path) -> None:
    """Found by a hostile review: each raised out of explain, ran out of memory, or lost a log without a word."""
    with zipfile.ZipFile(tmp_path / "no-name.zip", "w") as archive:  # zipfile reads it, then fails on the name
        archive.writestr(zipfile.ZipInfo(""), OOM)
        archive.writestr("rank1.log", XID)
    assert explain_paths([tmp_path / "no-name.zip"]).category == "gpu_hardware"
    bz2_member = tmp_path / "bz2-member.zip"  # zipfile decompresses a bzip2 member's chunk whole: not read
    with zipfile.ZipFile(bz2_member, "w", zipfile.ZIP_BZIP2) as archive:
        archive.writestr("rank1.log", XID)
    verdict, read = read_paths([bz2_member])
    assert read == 0 and "compressed with zip method 12" in verdict.warnings[0]
    overlap = bytearray(_zip(tmp_path / "overlap.zip", {"a.log": b"x" * 5000, "b.log": b"y" * 5000}).read_bytes())
    second = overlap.find(b"PK\x01\x02", overlap.find(b"PK\x01\x02") + 4)  # b.log's index entry points at a.log
    overlap[second + 42:second + 46] = (0).to_bytes(4, "little")
    (tmp_path / "overlap.zip").write_bytes(bytes(overlap))
    verdict, read = read_paths([tmp_path / "overlap.zip"])
    assert read == 0 and verdict.warnings[0].endswith("zip entries overlap (a zip bomb?), skipped")
    long_name = tarfile.TarInfo("x" * (packed.MAX_HEADER_BYTES + 1))  # tarfile would hold the whole name
    long_name.size = len(XID)
    with tarfile.open(tmp_path / "long.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(long_name, io.BytesIO(XID))
    verdict, read = read_paths([tmp_path / "long.tar"])
    assert read == 0 and "name or pax header" in verdict.warnings[0]
    whole = _tar(tmp_path / "two.tar", {"node-1/rank1.log": b"ok\n", "node-2/rank2.log": XID}, mode="w").read_bytes()
    cut = tmp_path / "cut-in-header.tar"
    cut.write_bytes(whole[:512 + 512 + 100])  # 100 bytes into the second header: tarfile ends quietly there
    verdict, read = read_paths([cut])
    assert read == 1 and verdict.warnings[0].startswith(f"{cut}: tar archive cut or damaged after 1 logs (")
    says_ustar = tmp_path / "notes.log"
    says_ustar.write_bytes(b" " * 257 + b"ustar and then a failure\n" + b" " * 300 + b"\n" + OOM)
    assert explain_paths([says_ustar]).category == "gpu_memory_oom"  # a tar header's checksum would not add up
    double = tmp_path / "double.log.gz"
    double.write_bytes(gzip.compress(gzip.compress(XID)))
    verdict, read = read_paths([double])
    assert read == 0 and verdict.warnings[0] == f"{double}: gzip inside gzip: unpack it first, skipped"
    inner = _tar(tmp_path / "in.tgz", {"a.log": XID}).read_bytes()
    nested = _tar(tmp_path / "nested.tar", {"node-0/inner.tar.gz": inner}, mode="w")
    verdict, read = read_paths([nested])
    assert read == 0
    assert verdict.warnings[0].endswith("node-0/inner.tar.gz: an archive inside an archive: unpack it first, skipped")


def test_the_packed_folder_is_never_taken_for_a_node(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "support-bundle.tar.gz", {"xid79-job/node-2/rank5.log": XID})
    assert explain_paths([archive]).nodes == ("node-2",)


def test_the_library_unpacks_bytes_as_it_unpacks_files(tmp_path: Path) -> None:
    from kcover import explain

    assert explain(gzip.compress(b"ok\n" + XID)).category == "gpu_hardware"
    bundle = _zip(tmp_path / "b.zip", {"node-3/rank1.log": XID}).read_bytes()
    verdict = explain(bundle, source="bundle.zip")
    assert (verdict.category, verdict.nodes) == ("gpu_hardware", ("node-3",))
    assert explain(b"\x28\xb5\x2f\xfd" + bytes(8)).warnings == (
        "<input>: compressed with zstd, which kcover cannot read: decompress it first (zstd -dc FILE | kcover explain),"
        " skipped",
    )
    assert explain(XID.decode()).category == "gpu_hardware"  # text is text


def test_bytes_and_text_give_the_same_verdict_on_every_corpus_excerpt() -> None:
    """Found by a hostile review: reading the first 512 bytes to tell the format made them the first block."""
    from bench.corpus_accuracy import CORPUS, FIELD, load_excerpts

    from kcover import explain
    from kcover.report import verdict_to_dict

    excerpts = load_excerpts(CORPUS) + load_excerpts(FIELD)
    assert len(excerpts) > 1500
    differing = sum(  # a count: the field corpus's holdout half is never printed
        verdict_to_dict(explain(e.text)) != verdict_to_dict(explain(e.text.encode()))
        or [f.evidence for f in explain(e.text).faults] != [f.evidence for f in explain(e.text.encode()).faults]
        for e in excerpts
    )
    assert differing == 0


def test_a_rotated_file_caught_mid_compression_is_read_once(tmp_path: Path) -> None:
    folder = tmp_path / "training_worker-3_0f4d2c1e-1111-2222-3333-444455556666" / "trainer"
    folder.mkdir(parents=True)
    (folder / "0.log.20261201-090000").write_bytes(_cri("step 1", XID.decode().strip()))
    (folder / "0.log.20261201-090000.gz").write_bytes(gzip.compress(_cri("step 1", XID.decode().strip())))
    (folder / "0.log").write_bytes(_cri("step 2"))
    verdict, read = read_paths([tmp_path])
    assert read == 2  # the plain file and the log; the .gz copy the kubelet is about to keep instead is not read
    assert verdict.root is not None and verdict.root.count == 1
    assert verdict.root.evidence.source == "training/worker-3/trainer/0.log"
