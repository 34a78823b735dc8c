"""The checkpoint store (control/checkpoint.py) on real files: a restore gives back exactly the
recorded tree but for what is excluded, costs grow with what changed, and a damaged or missing
checkpoint, or a full volume, fails before the workspace changes."""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun_operator.control import checkpoint
from agentrun_operator.control.checkpoint import (
    STORE_DIR,
    CheckpointCorrupt,
    CheckpointError,
    CheckpointMissing,
    CheckpointNoSpace,
    exists,
    list_checkpoints,
    owner,
    prune,
    record,
    restore,
    tree_digest,
    valid_id,
)

NOBODY = 65534


def write(path: Path, content: str | bytes, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    if mode is not None:
        path.chmod(mode)
    return path


def workspace(root: Path) -> Path:
    """A small tree with every kind of entry the store records."""
    write(root / "README.md", "# project\n")
    write(root / "src" / "main.py", "print('hi')\n", 0o755)
    write(root / "src" / "lib" / "util.py", "def f(): ...\n")
    write(root / "notes.txt", "keep me\n", 0o600)
    (root / "empty").mkdir()
    (root / "docs").mkdir()
    write(root / "docs" / "guide.md", "guide\n")
    (root / "link").symlink_to("src/main.py")
    (root / "dangling").symlink_to("nowhere/at/all")
    return root


WORKSPACE_BYTES = len("# project\nprint('hi')\ndef f(): ...\nkeep me\nguide\n")


def manifest_of(root: Path, checkpoint_id: str) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The manifest as its documented format says: a header line, then the entries."""
    head, body = gzip.decompress(
        (root / STORE_DIR / "manifests" / f"{checkpoint_id}.json.gz").read_bytes()
    ).split(b"\n", 1)
    return json.loads(head), {row[0]: row for row in json.loads(body)}


def objects(root: Path) -> set[str]:
    base = root / STORE_DIR / "objects"
    return {p.parent.name + p.name for p in base.glob("*/*")} if base.exists() else set()


def mtimes(root: Path) -> dict[str, int]:
    """The mtime of every file and directory outside the store (symlinks and .git aside)."""
    found = {".": root.stat().st_mtime_ns}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(".agentrun") or ".git" in rel.split("/") or path.is_symlink():
            continue
        found[rel] = path.lstat().st_mtime_ns
    return found


def snapshot(root: Path) -> dict[str, tuple[int, bytes | str | None]]:
    """Every path under root, store and all: mode and content (or link target)."""
    found: dict[str, tuple[int, bytes | str | None]] = {}
    for path in sorted(root.rglob("*")):
        st_ = path.lstat()
        if stat.S_ISLNK(st_.st_mode):
            found[path.relative_to(root).as_posix()] = (st_.st_mode, os.readlink(path))
        elif stat.S_ISREG(st_.st_mode):
            found[path.relative_to(root).as_posix()] = (st_.st_mode, path.read_bytes())
        else:
            found[path.relative_to(root).as_posix()] = (st_.st_mode, None)
    return found


# --- the round trip -----------------------------------------------------------------------------


def test_a_restore_undoes_every_kind_of_change(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    made = record(str(root), "run-1-1")
    assert (made.files, made.bytes, made.hashed_files) == (5, WORKSPACE_BYTES, 5)
    recorded = tree_digest(str(root))
    times = mtimes(root)

    (root / "README.md").write_text("dirty")
    (root / "notes.txt").unlink()
    write(root / "created.txt", "new")
    (root / "new-empty-dir").mkdir()
    (root / "src" / "main.py").chmod(0o600)
    (root / "docs" / "guide.md").unlink()
    (root / "docs" / "guide.md").symlink_to("/etc/passwd")
    shutil.rmtree(root / "src" / "lib")
    write(root / "src" / "lib", "a file where a directory was")
    (root / "link").unlink()
    (root / "link").symlink_to("README.md")
    (root / "empty").rmdir()
    assert tree_digest(str(root)) != recorded

    done = restore(str(root), "run-1-1")

    assert tree_digest(str(root)) == recorded
    assert (root / "README.md").read_text() == "# project\n"
    assert (root / "notes.txt").read_text() == "keep me\n"
    assert stat.S_IMODE((root / "notes.txt").stat().st_mode) == 0o600
    assert not (root / "created.txt").exists()
    assert not (root / "new-empty-dir").exists()
    assert stat.S_IMODE((root / "src" / "main.py").stat().st_mode) == 0o755
    assert not (root / "docs" / "guide.md").is_symlink()
    assert (root / "docs" / "guide.md").read_text() == "guide\n"
    assert (root / "src" / "lib").is_dir()
    assert (root / "src" / "lib" / "util.py").read_text() == "def f(): ...\n"
    assert os.readlink(root / "link") == "src/main.py"
    assert os.readlink(root / "dangling") == "nowhere/at/all"
    assert (root / "empty").is_dir()
    assert mtimes(root) == times
    # README, notes, main.py (mode), guide.md, util.py and the link; created.txt, new-empty-dir,
    # the guide.md symlink and the src/lib file removed.
    assert (done.written, done.deleted) == (6, 4)


def test_restoring_an_unchanged_tree_rewrites_nothing(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    record(str(root), "run-1-1")
    inodes = {p: p.lstat().st_ino for p in root.rglob("*")}
    done = restore(str(root), "run-1-1")
    assert (done.written, done.deleted) == (0, 0)
    assert {p: p.lstat().st_ino for p in root.rglob("*")} == inodes


def test_a_file_rewritten_with_its_old_content_and_mtime_is_read_not_rewritten(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    record(str(root), "run-1-1")
    readme = root / "README.md"
    before = readme.stat()
    readme.write_text("# project\n")  # same bytes: a new ctime, the same size
    os.utime(readme, ns=(before.st_atime_ns, before.st_mtime_ns))
    inode = readme.stat().st_ino
    done = restore(str(root), "run-1-1")
    assert (done.written, readme.stat().st_ino) == (0, inode)


def test_a_directory_replaced_by_a_symlink_is_never_written_through(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    outside = tmp_path / "outside"
    outside.mkdir()
    record(str(root), "run-1-1")
    recorded = tree_digest(str(root))
    shutil.rmtree(root / "src")
    (root / "src").symlink_to(outside)
    restore(str(root), "run-1-1")
    assert list(outside.iterdir()) == []
    assert (root / "src").is_dir() and not (root / "src").is_symlink()
    assert tree_digest(str(root)) == recorded


def test_hard_links_are_recorded_and_restored_as_separate_files(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    write(root / "a", "shared")
    os.link(root / "a", root / "b")
    record(str(root), "run-1-1")
    write(root / "a", "changed through a link")
    restore(str(root), "run-1-1")
    assert (root / "a").read_text() == (root / "b").read_text() == "shared"
    assert (root / "a").stat().st_ino != (root / "b").stat().st_ino


def test_a_file_that_vanishes_while_recording_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = workspace(tmp_path / "ws")
    walk = checkpoint._walk

    def vanishing(top: str, skip: frozenset[str]) -> Iterator[tuple[str, str, os.stat_result | None]]:
        for rel, kind, st_ in walk(top, skip):
            if rel == "notes.txt":
                (root / rel).unlink()  # listed, then gone before it is read
            yield rel, kind, st_

    monkeypatch.setattr(checkpoint, "_walk", vanishing)
    made = record(str(root), "run-1-1")
    assert made.files == 4
    assert "notes.txt" not in manifest_of(root, "run-1-1")[1]


# --- the property -------------------------------------------------------------------------------

NAMES = st.sampled_from(["a", "b", "c", "d", ".hidden", "x y"])
PATHS = st.lists(NAMES, min_size=1, max_size=3).map("/".join)
FILE_MODES = st.sampled_from([0o644, 0o600, 0o755, 0o444, 0o4755])
DIR_MODES = st.sampled_from([0o755, 0o700, 0o750, 0o2775])
CONTENT = st.binary(max_size=300) | st.sampled_from([b"", b"same", b"same"])
CHANGE = st.one_of(
    st.tuples(st.just("write"), PATHS, CONTENT, FILE_MODES),
    st.tuples(st.just("mkdir"), PATHS, st.none(), DIR_MODES),
    st.tuples(st.just("symlink"), PATHS, st.sampled_from(["a", "../x", "/etc", "b/c", ""]), st.none()),
    st.tuples(st.just("remove"), PATHS, st.none(), st.none()),
    st.tuples(st.just("chmod"), PATHS, st.none(), FILE_MODES),
    st.tuples(st.just("touch"), PATHS, st.none(), st.none()),
)


def _clear(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def apply_change(root: Path, change: tuple[str, str, Any, Any]) -> None:
    """One change to the tree, whatever is at the path now (parents made as needed)."""
    kind, rel, value, mode = change
    path = root / rel
    for parent in reversed(path.relative_to(root).parents[:-1]):
        at = root / parent
        if at.is_symlink() or (at.exists() and not at.is_dir()):
            at.unlink()
        if not at.exists():
            at.mkdir()
    if kind == "write":
        _clear(path)
        write(path, value, mode)
    elif kind == "mkdir":
        if not path.is_dir() or path.is_symlink():
            _clear(path)
            path.mkdir()
        path.chmod(mode)
    elif kind == "symlink":
        _clear(path)
        path.symlink_to(value or "dangling")
    elif kind == "remove":
        _clear(path)
    elif kind == "chmod" and path.exists() and not path.is_symlink():
        path.chmod(mode if path.is_file() else 0o711)
    elif kind == "touch" and path.exists() and not path.is_symlink():
        os.utime(path, ns=(0, path.stat().st_mtime_ns + 1_000_000_000))


@settings(max_examples=60)
@given(tree=st.lists(CHANGE, max_size=14), changes=st.lists(CHANGE, min_size=1, max_size=10))
def test_restore_gives_back_the_recorded_tree_after_any_changes(
    tree: list[tuple[str, str, Any, Any]], changes: list[tuple[str, str, Any, Any]]
) -> None:
    with tempfile.TemporaryDirectory() as top:
        root = Path(top) / "ws"
        root.mkdir()
        for change in tree:
            apply_change(root, change)
        record(str(root), "it-1")
        recorded, times = tree_digest(str(root)), mtimes(root)
        for change in changes:
            apply_change(root, change)
        restore(str(root), "it-1")
        assert tree_digest(str(root)) == recorded
        assert mtimes(root) == times
        assert restore(str(root), "it-1").written == 0  # what a restore wrote is the checkpoint's


# --- exclusions ---------------------------------------------------------------------------------


def test_excluded_paths_git_and_the_store_are_neither_recorded_nor_touched(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    write(root / "cache" / "blob", "cached")
    write(root / "data" / "big" / "part", "large")
    write(root / "data" / "small", "small")
    write(root / ".git" / "HEAD", "ref: refs/heads/main\n")
    write(root / "vendor" / "lib" / ".git" / "config", "[core]\n", 0o600)
    exclude = ["cache", "data/big/"]
    record(str(root), "run-1-1", exclude)
    recorded = tree_digest(str(root), exclude)

    paths = set(manifest_of(root, "run-1-1")[1])
    assert {"data", "data/small", "vendor/lib"} <= paths
    assert not [
        p for p in paths if p.startswith(("cache", "data/big", ".agentrun/")) or ".git" in p.split("/")
    ]

    write(root / "cache" / "blob", "cached, changed")
    write(root / "cache" / "new", "new in cache")
    shutil.rmtree(root / "data" / "big")
    write(root / "data" / "big" / "other", "replaced")
    write(root / ".git" / "HEAD", "ref: refs/heads/topic\n")
    write(root / "vendor" / "lib" / ".git" / "objects" / "ab", "object")
    write(root / "later" / ".git" / "HEAD", "a repository cloned since")
    write(root / "later" / "tracked.py", "the clone's working tree")
    write(root / "data" / "small", "dirty")
    kept = {
        p: v
        for p, v in snapshot(root).items()
        if p.startswith(("cache", "data/big", "later/.git", ".agentrun")) or ".git" in p.split("/")
    }

    restore(str(root), "run-1-1", exclude)

    assert tree_digest(str(root), exclude) != recorded  # `later` holds a repository: it stays
    assert {p: v for p, v in snapshot(root).items() if p in kept} == kept
    assert set(kept) <= set(snapshot(root))
    assert (root / "data" / "small").read_text() == "small"
    assert not (root / "later" / "tracked.py").exists()
    shutil.rmtree(root / "later")
    assert tree_digest(str(root), exclude) == recorded


def test_a_restore_that_would_delete_an_excluded_path_refuses_and_changes_nothing(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    record(str(root), "run-1-1")
    (root / "notes.txt").unlink()
    write(root / "notes.txt" / ".git" / "HEAD", "a clone where a file was")
    write(root / "README.md", "dirty")
    before = snapshot(root)
    with pytest.raises(CheckpointError, match=r"'notes.txt' cannot be restored.*unchanged"):
        restore(str(root), "run-1-1")
    assert snapshot(root) == before


def test_a_special_file_is_skipped_and_kept(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    os.mkfifo(root / "docs" / "pipe")
    record(str(root), "run-1-1")
    assert "docs/pipe" not in manifest_of(root, "run-1-1")[1]
    write(root / "docs" / "guide.md", "dirty")
    restore(str(root), "run-1-1")
    assert stat.S_ISFIFO((root / "docs" / "pipe").lstat().st_mode)
    assert (root / "docs" / "guide.md").read_text() == "guide\n"


@pytest.mark.parametrize("bad", ["/abs", "../up", "a/../../b", ".", ""])
def test_an_exclude_outside_the_volume_is_refused(tmp_path: Path, bad: str) -> None:
    root = workspace(tmp_path / "ws")
    with pytest.raises(CheckpointError, match="not a path inside the volume"):
        record(str(root), "run-1-1", [bad])
    assert not exists(str(root), "run-1-1")


# --- cost ---------------------------------------------------------------------------------------


def test_recording_again_reads_and_stores_only_the_changed_files(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for i in range(300):
        write(root / f"d{i % 7}" / f"f{i}.bin", os.urandom(1000 + i))
    first = record(str(root), "run-1-1")
    assert (first.files, first.hashed_files) == (300, 300)

    changed = [root / f"d{i % 7}" / f"f{i}.bin" for i in range(0, 300, 30)]
    for path in changed:
        write(path, os.urandom(2000))
    again = record(str(root), "run-1-2")
    manifest_bytes = (root / STORE_DIR / "manifests" / "run-1-2.json.gz").stat().st_size
    assert again.hashed_files == 10
    assert again.added_bytes == 10 * 2000 + manifest_bytes
    assert again.bytes == first.bytes + sum(2000 - (1000 + i) for i in range(0, 300, 30))

    unchanged = record(str(root), "run-1-3")
    assert (unchanged.hashed_files, unchanged.added_bytes) == (
        0,
        (root / STORE_DIR / "manifests" / "run-1-3.json.gz").stat().st_size,
    )

    for path in changed:
        write(path, "dirty")
    assert restore(str(root), "run-1-3").written == 10
    # The restored files are new inodes of known content: read to be sure, not stored again.
    after = record(str(root), "run-1-4")
    manifest_bytes = (root / STORE_DIR / "manifests" / "run-1-4.json.gz").stat().st_size
    assert (after.hashed_files, after.added_bytes) == (10, manifest_bytes)


def test_the_same_content_is_stored_once(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    for i in range(5):
        write(root / f"copy{i}", "identical")
    made = record(str(root), "run-1-1")
    assert (made.files, made.hashed_files, len(objects(root))) == (5, 5, 1)


# --- damage -------------------------------------------------------------------------------------


def _object_of(root: Path, rel: str) -> Path:
    sha = str(manifest_of(root, "run-1-1")[1][rel][7])
    return root / STORE_DIR / "objects" / sha[:2] / sha[2:]


def _truncate(root: Path) -> str:
    path = root / STORE_DIR / "manifests" / "run-1-1.json.gz"
    path.write_bytes(path.read_bytes()[:40])
    return str(path)


def _garbage(root: Path) -> str:
    path = root / STORE_DIR / "manifests" / "run-1-1.json.gz"
    path.write_bytes(b"this is not a manifest")
    return str(path)


def _bad_entries(root: Path) -> str:
    path = root / STORE_DIR / "manifests" / "run-1-1.json.gz"
    head, _ = manifest_of(root, "run-1-1")
    path.write_bytes(gzip.compress(json.dumps(head).encode() + b"\n" + b'[["README.md", "file"]]'))
    return str(path)


def _escaping(root: Path) -> str:
    """A tampered manifest that would write above the root."""
    path = root / STORE_DIR / "manifests" / "run-1-1.json.gz"
    head, entries = manifest_of(root, "run-1-1")
    evil = [*entries["README.md"]]
    evil[0] = "../evil"
    rows = [*entries.values(), evil]
    path.write_bytes(gzip.compress(json.dumps(head).encode() + b"\n" + json.dumps(rows).encode()))
    return str(path)


def _missing_object(root: Path) -> str:
    obj = _object_of(root, "README.md")
    obj.unlink()
    return str(obj)


def _altered_object(root: Path) -> str:
    obj = _object_of(root, "README.md")
    obj.chmod(0o644)
    obj.write_bytes(b"# pro_ect\n")  # the same length, another content
    return str(obj)


def _deleted_store(root: Path) -> str:
    shutil.rmtree(root / STORE_DIR)
    return "run-1-1"


def _deleted_manifest(root: Path) -> str:
    path = root / STORE_DIR / "manifests" / "run-1-1.json.gz"
    path.unlink()
    return str(path)


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        (_deleted_store, CheckpointMissing),
        (_deleted_manifest, CheckpointMissing),
        (_truncate, CheckpointCorrupt),
        (_garbage, CheckpointCorrupt),
        (_bad_entries, CheckpointCorrupt),
        (_escaping, CheckpointCorrupt),
        (_missing_object, CheckpointCorrupt),
        (_altered_object, CheckpointCorrupt),
    ],
)
def test_a_damaged_checkpoint_fails_the_restore_before_the_workspace_changes(
    tmp_path: Path, damage: Callable[[Path], str], error: type[CheckpointError]
) -> None:
    root = workspace(tmp_path / "ws")
    record(str(root), "run-1-1")
    write(root / "README.md", "dirty")  # the restore needs README.md's object
    (root / "notes.txt").unlink()
    write(root / "created.txt", "new")
    shutil.rmtree(root / "src" / "lib")
    named = damage(root)
    before, digest = snapshot(root), tree_digest(str(root))

    with pytest.raises(error) as failed:
        restore(str(root), "run-1-1")

    assert named in str(failed.value)
    assert str(root / STORE_DIR) in str(failed.value)
    assert "'run-1-1'" in str(failed.value)
    assert tree_digest(str(root)) == digest
    assert snapshot(root) == before
    assert not (tmp_path / "evil").exists()


def test_a_checkpoint_never_recorded_is_missing(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    assert not exists(str(root), "run-1-1")
    with pytest.raises(CheckpointMissing, match="'run-1-1' is not in"):
        restore(str(root), "run-1-1")
    with pytest.raises(CheckpointMissing):
        owner(str(root), "run-1-1")


def test_a_damaged_newest_manifest_only_costs_recording_its_files_again(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    record(str(root), "run-1-1")
    _garbage(root)
    again = record(str(root), "run-1-2")
    assert again.hashed_files == again.files == 5


# --- a full volume ------------------------------------------------------------------------------


def _full_after(monkeypatch: pytest.MonkeyPatch, writes: int) -> None:
    """The volume fills after `writes` writes of the store's own writer."""
    real = checkpoint._write_all
    count = [0]

    def filling(fd: int, data: bytes | memoryview) -> None:
        count[0] += 1
        if count[0] > writes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    monkeypatch.setattr(checkpoint, "_write_all", filling)


@pytest.mark.parametrize("writes", [0, 2, 4])
def test_a_full_volume_fails_the_record_and_leaves_nothing_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writes: int
) -> None:
    root = workspace(tmp_path / "ws")
    record(str(root), "run-1-1")
    kept_objects = objects(root)
    for name in ("README.md", "notes.txt", "src/main.py", "docs/guide.md"):
        write(root / name, f"new content of {name}")
    _full_after(monkeypatch, writes)  # 4 new objects, then the manifest: the 5th write

    with pytest.raises(CheckpointNoSpace, match=r"volume is full .* needed \d+ bytes") as failed:
        record(str(root), "run-1-2")

    assert "'run-1-2'" in str(failed.value)
    assert not exists(str(root), "run-1-2")
    assert objects(root) == kept_objects
    assert list((root / STORE_DIR / "tmp").iterdir()) == []
    monkeypatch.undo()
    write(root / "README.md", "dirty")
    restore(str(root), "run-1-1")
    assert (root / "README.md").read_text() == "# project\n"


def test_a_full_volume_fails_the_restore_before_the_workspace_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = workspace(tmp_path / "ws")
    record(str(root), "run-1-1")
    for name in ("README.md", "notes.txt", "src/main.py"):
        write(root / name, "dirty")
    before = snapshot(root)
    _full_after(monkeypatch, 2)
    with pytest.raises(CheckpointNoSpace, match="workspace is unchanged"):
        restore(str(root), "run-1-1")
    assert snapshot(root) == before


# --- listing and pruning ------------------------------------------------------------------------


def test_list_checkpoints_gives_id_created_files_and_bytes_oldest_first(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    started = time.time()
    record(str(root), "run-1-1", owner="uid-1")
    write(root / "more.txt", "12345")
    record(str(root), "run-1-2", owner="uid-1")
    listed = list_checkpoints(str(root))
    assert [(c.id, c.files) for c in listed] == [("run-1-1", 5), ("run-1-2", 6)]
    assert listed[1].bytes == listed[0].bytes + 5
    assert started <= listed[0].created <= listed[1].created <= time.time()
    assert owner(str(root), "run-1-2") == "uid-1"
    assert list_checkpoints(str(tmp_path / "never")) == []


def test_prune_keeps_the_newest_of_a_prefix_and_deletes_only_unreferenced_objects(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    ids = ["a-1", "a-2", "b-1", "a-3", "a-4", "b-2"]
    content = {}
    for checkpoint_id in ids:
        content[checkpoint_id] = f"only in {checkpoint_id}"
        write(root / "changing.txt", content[checkpoint_id])
        record(str(root), checkpoint_id)
    only = {i: _sha(content[i]) for i in ids}
    shared = manifest_of(root, "a-1")[1]["README.md"][7]

    assert prune(str(root), "a-", 2) == ["a-1", "a-2"]

    assert [c.id for c in list_checkpoints(str(root))] == ["b-1", "a-3", "a-4", "b-2"]
    assert only["a-1"] not in objects(root) and only["a-2"] not in objects(root)
    assert {only[i] for i in ("b-1", "a-3", "a-4", "b-2")} | {shared} <= objects(root)
    write(root / "changing.txt", "dirty")
    restore(str(root), "b-1")
    assert (root / "changing.txt").read_text() == "only in b-1"


def test_prune_with_nothing_to_prune_deletes_no_object(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    record(str(root), "a-1")
    orphan = root / STORE_DIR / "objects" / "00" / ("0" * 62)
    write(orphan, "left by a record that died")
    assert prune(str(root), "a-", 1) == []
    assert orphan.exists()
    assert prune(str(root), "a-", 0) == ["a-1"]
    assert objects(root) == set()


def test_prune_keeps_every_object_when_a_remaining_manifest_is_unreadable(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    record(str(root), "a-1")
    write(root / "x", "x")
    record(str(root), "b-1")
    record(str(root), "a-2")
    kept = objects(root)
    path = root / STORE_DIR / "manifests" / "b-1.json.gz"
    path.write_bytes(b"garbage")
    with pytest.raises(CheckpointCorrupt, match=str(path)):
        prune(str(root), "a-", 1)
    assert objects(root) == kept
    assert not exists(str(root), "a-1")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --- ids ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("good", ["a", "run-1-1", "0.9", "x" * 201])
def test_valid_ids(good: str) -> None:
    assert valid_id(good)


@pytest.mark.parametrize("bad", ["", "-a", ".a", "A", "a/b", "x" * 202, "a b", "..", "a\x00"])
def test_invalid_ids_are_refused(tmp_path: Path, bad: str) -> None:
    assert not valid_id(bad)
    assert not exists(str(tmp_path), bad)
    with pytest.raises(CheckpointError, match="not a valid id"):
        record(str(tmp_path), bad)


# --- an ordinary user ---------------------------------------------------------------------------


def as_ordinary_user(directory: Path, work: Callable[[], None]) -> str:
    """Run `work` in `directory` (root: "."), as `nobody` when the test is root: its traceback, or ""."""
    if os.geteuid() != 0:
        cwd = os.getcwd()
        os.chdir(directory)
        try:
            work()
        except Exception:
            return traceback.format_exc()
        finally:
            os.chdir(cwd)
        return ""
    for path in [directory, *directory.rglob("*")]:
        os.lchown(path, NOBODY, NOBODY)
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(reader)
        status = 0
        try:
            os.chdir(directory)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            work()
        except BaseException:
            os.write(writer, traceback.format_exc().encode())
            status = 1
        os._exit(status)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        failure = pipe.read().decode()
    os.waitpid(pid, 0)
    return failure


def test_an_ordinary_user_restores_into_read_only_directories(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")

    def work() -> None:
        record(".", "run-1-1")
        recorded, times = tree_digest("."), mtimes(Path("."))
        write(Path("docs/extra/deep.txt"), "new")
        write(Path("src/lib/util.py"), "dirty")
        os.chmod("docs/extra", 0o500)
        os.chmod("docs", 0o555)
        os.chmod("src/lib", 0o500)
        restore(".", "run-1-1")
        assert tree_digest(".") == recorded
        assert mtimes(Path(".")) == times
        assert stat.S_IMODE(os.stat("docs").st_mode) == 0o755

    assert as_ordinary_user(root, work) == ""


def test_the_store_makes_agentrun_as_the_volume_root_is(tmp_path: Path) -> None:
    """The reporter records the first checkpoint as root before any `main` ran: the `.agentrun` it
    makes has the volume root's owner, group and mode, so a `main` of another user may write its
    control file there as it may write the root; the store inside is the reporter's."""
    root = workspace(tmp_path / "ws")
    root.chmod(0o2775)
    if os.geteuid() == 0:
        os.chown(root, NOBODY, NOBODY)
    record(str(root), "run-1-1")
    top, made = root.stat(), (root / ".agentrun").stat()
    assert stat.S_IMODE(made.st_mode) == 0o2775
    assert (made.st_uid, made.st_gid) == (top.st_uid, top.st_gid)
    assert (root / STORE_DIR).stat().st_uid == os.geteuid()
    record(str(root), "run-1-2")
    again = (root / ".agentrun").stat()
    assert (again.st_mode, again.st_uid, again.st_gid) == (made.st_mode, made.st_uid, made.st_gid)


def test_an_agentrun_directory_already_there_is_left_as_it_is(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    (root / ".agentrun").mkdir(mode=0o750)
    (root / ".agentrun").chmod(0o750)
    before = (root / ".agentrun").stat()
    record(str(root), "run-1-1")
    after = (root / ".agentrun").stat()
    assert (stat.S_IMODE(after.st_mode), after.st_uid, after.st_gid) == (0o750, before.st_uid, before.st_gid)


def test_an_unreadable_file_fails_the_record_with_its_name(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    (root / "notes.txt").chmod(0)

    def work() -> None:
        with pytest.raises(CheckpointError, match=r"'\./notes.txt' cannot be read.*exclude 'notes.txt'"):
            record(".", "run-1-1")
        assert not exists(".", "run-1-1")
        assert list(Path(STORE_DIR, "tmp").iterdir()) == []

    assert as_ordinary_user(root, work) == ""


def test_a_directory_the_user_cannot_search_fails_the_restore_before_anything_changes(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")

    def work() -> None:
        record(".", "run-1-1")
        write(Path("README.md"), "dirty")
        write(Path("private/secret"), "s")
        os.chmod("private", 0o600)  # listable, its entries cannot be looked at
        before = {p: p.read_bytes() for p in Path(".").glob("*") if p.is_file()}
        with pytest.raises(CheckpointError, match=r"'\./private/secret' cannot be looked at"):
            restore(".", "run-1-1")
        assert {p: p.read_bytes() for p in Path(".").glob("*") if p.is_file()} == before
        os.chmod("private", 0o700)

    assert as_ordinary_user(root, work) == ""


def test_the_store_imports_the_standard_library_only() -> None:
    """It runs in every iteration pod, before `main`: nothing to install, little to import."""
    code = (
        "import sys; before = set(sys.modules); import agentrun_operator.control.checkpoint; "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = {name.split(".")[0] for name in proc.stdout.split()}
    assert "agentrun_operator" in loaded
    assert loaded - set(sys.stdlib_module_names) == {"agentrun_operator"}


# --- another work tree (loop.candidates) --------------------------------------------------------


def test_a_candidate_tree_gets_the_roots_checkpoint_and_records_its_own_with_the_store_at_root(
    tmp_path: Path,
) -> None:
    root = workspace(tmp_path / "ws")
    write(root / ".git" / "HEAD", "ref: refs/heads/main\n")
    write(root / "cache" / "big.bin", "not recorded")
    record(str(root), "run_1_3", exclude=["cache"])
    tree = Path(checkpoint.candidate_tree(str(root), "run_1_3", 0))
    tree.mkdir(parents=True)

    done = restore(str(root), "run_1_3", exclude=["cache"], tree=str(tree))

    assert done.written == 7  # five files, two symlinks
    assert tree_digest(str(tree)) == tree_digest(str(root), exclude=["cache"])
    assert not (tree / ".git").exists() and not (tree / "cache").exists()
    assert not (tree / STORE_DIR).exists()  # the store stays at the root
    # Recording the root leaves the candidates' trees out; so does a restore of the root.
    assert checkpoint.CANDIDATES_DIR + "/run_1_3" not in manifest_of(root, "run_1_3")[1]
    record(str(root), "run_1_4", exclude=["cache"])
    assert not any(p.startswith(checkpoint.CANDIDATES_DIR) for p in manifest_of(root, "run_1_4")[1])
    restore(str(root), "run_1_3", exclude=["cache"])
    assert (tree / "README.md").read_text() == "# project\n"

    (tree / "README.md").write_text("candidate 0 was here")
    write(tree / "cache" / "scratch", "excluded in the tree too")
    write(tree / ".git" / "HEAD", "ignored in the tree too")
    made = record(str(root), "run_1_3c0", exclude=["cache"], owner="uid-1", tree=str(tree))
    entries = manifest_of(root, "run_1_3c0")[1]
    assert made.files == 5 and "cache" not in entries and ".git" not in entries
    assert (root / "README.md").read_text() == "# project\n"  # the root is not what was recorded

    write(root / "README.md", "root changed meanwhile")
    restore(str(root), "run_1_3c0", exclude=["cache"])
    assert (root / "README.md").read_text() == "candidate 0 was here"
    assert (tree / "README.md").read_text() == "candidate 0 was here"  # a restore of the root kept it


def test_recording_a_copy_never_trusts_the_roots_stat_identity(tmp_path: Path) -> None:
    """The newest manifest is the root's: a candidate's file of the same path, size and mtime is
    another inode, so it is read and its content compared, never taken on the root's word."""
    root = workspace(tmp_path / "ws")
    record(str(root), "run_1_1")
    tree = Path(checkpoint.candidate_tree(str(root), "run_1_1", 1))
    tree.mkdir(parents=True)
    restore(str(root), "run_1_1", tree=str(tree))
    same = record(str(root), "run_1_1c1", tree=str(tree))
    assert same.hashed_files == 5 and same.added_bytes < 1000  # read, but no object added
    before = (tree / "notes.txt").stat()
    (tree / "notes.txt").write_text("changed!")  # the same size: only the content tells
    os.utime(tree / "notes.txt", ns=(before.st_atime_ns, before.st_mtime_ns))
    record(str(root), "run_1_1c2", tree=str(tree))
    assert manifest_of(root, "run_1_1c2")[1]["notes.txt"][7] == _sha("changed!")
    assert manifest_of(root, "run_1_1")[1]["notes.txt"][7] == _sha("keep me\n")


def test_a_tree_that_is_no_directory_is_refused(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    record(str(root), "run_1_1")
    with pytest.raises(CheckpointError, match="work tree"):
        restore(str(root), "run_1_1", tree=str(root / "nowhere"))
    with pytest.raises(CheckpointError, match="work tree"):
        record(str(root), "run_1_1c0", tree=str(root / "README.md"))


def test_fresh_tree_empties_what_an_earlier_attempt_left(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    root.chmod(0o751)
    rel = f"{checkpoint.CANDIDATES_DIR}/run_1_1/0"
    left = root / rel
    write(left / ".git" / "objects" / "x", "left")
    write(left / "locked" / "file", "left")
    (left / "locked").chmod(0o500)
    (left / "link").symlink_to(root / "README.md")
    assert checkpoint.fresh_tree(str(root), rel) == str(left)
    assert list(left.iterdir()) == []
    assert (root / "README.md").exists()  # a symlink is removed, never followed
    made = Path(checkpoint.fresh_tree(str(root), f"{checkpoint.CANDIDATES_DIR}/run_1_2/0"))
    assert stat.S_IMODE(made.stat().st_mode) == stat.S_IMODE(made.parent.stat().st_mode) == 0o751


def test_fresh_tree_refuses_a_symlink_on_its_way(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    outside = tmp_path / "outside"
    write(outside / "0" / "precious", "keep")
    (root / ".agentrun").mkdir()
    (root / checkpoint.CANDIDATES_DIR).mkdir()
    (root / checkpoint.CANDIDATES_DIR / "run_1_1").symlink_to(outside)
    with pytest.raises(CheckpointError, match="not a directory"):
        checkpoint.fresh_tree(str(root), f"{checkpoint.CANDIDATES_DIR}/run_1_1/0")
    assert (outside / "0" / "precious").read_text() == "keep"


# --- pruning by iteration -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("checkpoint_id", "iteration"),
    [("run_1_4", 4), ("run_1_4c0", 4), ("run_1_12c31", 12), ("run_1_", None), ("run_1_4c", None)],
)
def test_iteration_of(checkpoint_id: str, iteration: int | None) -> None:
    assert checkpoint.iteration_of(checkpoint_id, "run_1_") == iteration
    assert checkpoint.iteration_of(checkpoint_id, "run_2_") is None


def test_prune_keeps_or_removes_an_iteration_with_its_candidates(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    # Recorded out of iteration order on purpose: iterations count, not creation times.
    for checkpoint_id in ["run_1_3", "run_1_3c0", "run_1_3c1", "run_1_10", "run_1_2", "run_1_2c0", "other"]:
        write(root / "changing.txt", f"only in {checkpoint_id}")
        record(str(root), checkpoint_id)
    record(str(root), "run_1_odd")  # no loop makes such an id: left alone
    for checkpoint_id in ["run_1_2", "run_1_3"]:
        write(root / checkpoint.CANDIDATES_DIR / checkpoint_id / "0" / "work", "a copy")

    assert prune(str(root), "run_1_", 2) == ["run_1_2", "run_1_2c0"]
    assert not (root / checkpoint.CANDIDATES_DIR / "run_1_2").exists()
    assert (root / checkpoint.CANDIDATES_DIR / "run_1_3" / "0" / "work").exists()

    assert prune(str(root), "run_1_", 1) == ["run_1_3", "run_1_3c0", "run_1_3c1"]
    assert not (root / checkpoint.CANDIDATES_DIR / "run_1_3").exists()
    assert sorted(c.id for c in list_checkpoints(str(root))) == ["other", "run_1_10", "run_1_odd"]
    assert _sha("only in run_1_3c1") not in objects(root)
    assert _sha("only in other") in objects(root)


def test_two_processes_serialize_on_the_store_lock(tmp_path: Path) -> None:
    """The lock is a real flock: another process cannot take it while it is held."""
    root = workspace(tmp_path / "ws")
    probe = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n    sys.exit(3)\n"
    )
    lock = root / STORE_DIR / checkpoint.LOCK_FILE
    with checkpoint.locked(str(root)):
        held = subprocess.run([sys.executable, "-c", probe, str(lock)], check=False)
    free = subprocess.run([sys.executable, "-c", probe, str(lock)], check=False)
    assert (held.returncode, free.returncode) == (3, 0)


def test_a_promotion_with_its_base_restores_the_winner_exactly(tmp_path: Path) -> None:
    """A candidate's end restored over the workspace with the iteration's start as `base`: files the
    workspace still has as the base recorded them and the candidate left alone are known without
    reading; changed, created, deleted and mode-changed ones are restored; a workspace file that
    changed since the base (its identity differs) is compared by content, as without a base."""
    root = tmp_path / "ws"
    root.mkdir()
    for i in range(20):
        (root / f"f{i}.txt").write_text(f"file {i}\n")
    (root / "sub").mkdir()
    (root / "sub" / "deep.txt").write_text("deep\n")
    checkpoint.record(str(root), "s")
    tree = checkpoint.fresh_tree(str(root), f"{checkpoint.CANDIDATES_DIR}/s/0")
    checkpoint.restore(str(root), "s", tree=tree)
    copy = Path(tree)
    (copy / "f1.txt").write_text("changed by the winner\n")
    (copy / "f2.txt").unlink()
    (copy / "new.txt").write_text("new\n")
    (copy / "f3.txt").chmod(0o600)
    checkpoint.record(str(root), "sc0", tree=tree)
    winner = tree_digest(tree)
    (root / "f4.txt").write_text("file 4 touched after the base\n")  # same size is not needed: content
    done = checkpoint.restore(str(root), "sc0", base="s")
    assert tree_digest(str(root)) == winner
    assert done.written == 4  # f1 changed, new.txt, f4 put back, f3's mode (rewritten with its mode)
    assert (root / "f4.txt").read_text() == "file 4\n" and not (root / "f2.txt").exists()


def test_a_base_that_is_gone_only_costs_reading(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("a\n")
    checkpoint.record(str(root), "s")
    (root / "a.txt").write_text("b\n")
    checkpoint.record(str(root), "t")
    checkpoint.restore(str(root), "s", base="missing")
    assert (root / "a.txt").read_text() == "a\n"


def test_a_copys_end_with_its_tree_cache_reads_only_what_changed(tmp_path: Path) -> None:
    """A candidate's copy has new inodes, so the store's stat cache vouches for none of its files;
    the cache taken right after the copy does, and the end record reads only the changed file. The
    checkpoint is the same either way."""
    root = tmp_path / "ws"
    root.mkdir()
    for i in range(30):
        (root / f"f{i}.txt").write_text(f"file {i}\n")
    checkpoint.record(str(root), "s")
    tree = checkpoint.fresh_tree(str(root), f"{checkpoint.CANDIDATES_DIR}/s/0")
    checkpoint.restore(str(root), "s", tree=tree)
    cache = checkpoint.tree_cache(str(root), "s", tree)
    (Path(tree) / "f7.txt").write_text("changed\n")
    without = checkpoint.record(str(root), "sc0-plain", tree=tree)  # the newest manifest is "s"
    assert without.hashed_files == 30
    with_cache = checkpoint.record(str(root), "sc0", tree=tree, cache=cache)
    assert with_cache.hashed_files == 1
    checkpoint.restore(str(root), "sc0")
    assert (root / "f7.txt").read_text() == "changed\n"
    assert tree_digest(str(root)) == tree_digest(tree)
