"""The checkpoint store: the workspace's state recorded on the volume itself, restored exactly.

A retry of a failed attempt puts the state volume back to its iteration's start (loop.checkpoint,
docs/concepts.md#checkpoints); control/checkpointing.py decides when, this module records and
restores. It runs in the reporter before `main` starts, so it imports the standard library only,
and few modules of it (its import time is on every iteration's critical path).

Layout, under ``<root>/.agentrun/checkpoints`` (`STORE_DIR`): a small git-like object store, in
Python rather than git itself, because the reporter image has no git, and git records neither empty
directories nor full modes and ownership, and treats a nested ``.git`` as a submodule.

- ``objects/<sha256[:2]>/<sha256[2:]>``: every file content once, uncompressed (recording and
  restoring are file copies; compressing would cost more time than the volume's bytes are worth).
  An object is written to ``tmp/`` and renamed into place, so it is whole or absent.
- ``manifests/<id>.json.gz``: one per checkpoint, written last and renamed into place: a checkpoint
  exists iff its manifest does. Line 1 is the header (`list_checkpoints` reads only that); line 2
  the entries, one list per path, columns `FIELDS`: type, mode, ownership, size, mtime, and a
  file's sha256 with the stat identity (inode, ctime) change detection uses, or a symlink's target.

Cost grows with what changed, not with the workspace: recording stats every path but reads only the
files whose (size, mtime, inode, ctime) differ from the newest manifest's; restoring rewrites only
files whose stat identity differs from the checkpoint's (or, with the same size and mtime, whose
content does). Hard links are recorded as separate files and restored as separate files. A restore
sets modes and mtimes (a directory's after its contents), and ownership when it runs as root.
The root's own entry is ".", and ``.agentrun``, the store's directory, is recorded as a directory.

Never recorded and never touched by a restore: the store itself, the best-of-N candidates' work
trees (``<root>/.agentrun/candidates``, `CANDIDATES_DIR`), every path with a ``.git`` component (a
user's own repository is theirs), special files (fifos, sockets, devices), and the caller's
`exclude` paths (each with everything under it). A restore that could only reach the
checkpoint's state by deleting one of those (a checkpointed file where such a directory now is)
refuses before it changes anything.

Durability: temp files and renames make the store safe against a process that dies at any point;
nothing is fsynced, so a node crash may leave an object or manifest damaged, which a restore finds
(`CheckpointCorrupt`, content checked against its hash), never a silent wrong restore. One writer
at a time (the Job claim guarantees it for one loop's pods; the N candidate pods of one iteration
take the store's lock, `locked`).

Another work tree: `record` and `restore` take `tree`, a directory whose files are recorded or
restored with the store still under the root (a candidate's copy of the volume, `candidate_tree`);
the exclusions apply relative to the tree as they do to the root. `prune` counts iterations
(`iteration_of`): an iteration's start and its candidates' ends go together.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import json
import os
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

STORE_DIR: Final = ".agentrun/checkpoints"
CANDIDATES_DIR: Final = ".agentrun/candidates"
"""Best-of-N candidates' work trees, ``<id>/<index>`` under it: never recorded or restored with the
root (a restore of the root must not delete a candidate's copy that another pod works in)."""
LOCK_FILE: Final = "lock"
"""In the store: `locked` holds it (candidate pods of one iteration share the store)."""
MANIFEST_VERSION: Final = 1
MANIFEST_SUFFIX: Final = ".json.gz"
FIELDS: Final = (
    "path",
    "type",
    "mode",
    "uid",
    "gid",
    "size",
    "mtime_ns",
    "sha256_or_target",
    "ino",
    "ctime_ns",
)
"""The columns of a manifest entry. Directories have "" and 0 in the last three."""
DIR: Final = "dir"
FILE: Final = "file"
SYMLINK: Final = "symlink"
ROOT: Final = "."
"""The root's own entry: its mode, ownership and mtime are recorded and restored too."""
CHUNK: Final = 1 << 20
STALE_TEMP_SECONDS: Final = 3600.0
"""A temp file in the store this old was left by a process that died: recording removes it."""
MAX_HEADER_BYTES: Final = 1 << 16
_ID_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789._-")
_NO_SPACE: Final = frozenset({errno.ENOSPC, errno.EDQUOT})
_SKIPPED: Final = "skipped"
"""A walk's word for an excluded path or a special file: not descended, not recorded, kept."""
_RESTORE_TEMP: Final = ".agentrun-restore-"
_BAD_COMPONENTS: Final = frozenset({"", ".", ".."})
_HEX: Final = "0123456789abcdef"


class CheckpointError(Exception):
    """Why a checkpoint could not be recorded or restored; the message names the store path, the
    checkpoint id and the file or object at fault, and says what to do."""


class CheckpointMissing(CheckpointError):
    """No manifest for that id: the checkpoint was never recorded, or was pruned or deleted."""


class CheckpointCorrupt(CheckpointError):
    """The manifest is unreadable, or an object is missing or does not match its hash."""


class CheckpointNoSpace(CheckpointError):
    """The volume cannot hold the checkpoint (ENOSPC or EDQUOT): nothing this call wrote is left."""


@dataclass(frozen=True)
class Recorded:
    id: str
    files: int
    bytes: int
    """The sum of the checkpoint's file sizes."""
    added_bytes: int
    """What this call added to the store: new objects and the manifest."""
    hashed_files: int
    """Files read this time (the others were unchanged since the newest manifest)."""
    seconds: float


@dataclass(frozen=True)
class Restored:
    id: str
    written: int
    """Files and symlinks (re)written."""
    deleted: int
    """Paths removed (everything under a removed directory counted)."""
    seconds: float


@dataclass(frozen=True)
class CheckpointInfo:
    id: str
    created: float
    files: int
    bytes: int


class _Entry(NamedTuple):
    """One path of a manifest: a row of `FIELDS` (a tuple: json writes it as the row itself)."""

    path: str
    type: str
    mode: int
    uid: int
    gid: int
    size: int
    mtime_ns: int
    value: str
    """A file's sha256, a symlink's target, "" for a directory."""
    ino: int = 0
    ctime_ns: int = 0


class _Manifest(NamedTuple):
    header: dict[str, Any]
    entries: dict[str, _Entry]


def valid_id(checkpoint_id: str) -> bool:
    """`[a-z0-9][a-z0-9._-]{0,200}`: safe as a file name (no slash, no leading dot)."""
    return (
        0 < len(checkpoint_id) <= 201
        and checkpoint_id[0] not in ".-"
        and all(c in _ID_CHARS for c in checkpoint_id)
    )


def store_path(root: str) -> str:
    return os.path.join(root, STORE_DIR)


def _manifest_path(root: str, checkpoint_id: str) -> str:
    return os.path.join(store_path(root), "manifests", checkpoint_id + MANIFEST_SUFFIX)


def _object_path(root: str, sha: str) -> str:
    return os.path.join(store_path(root), "objects", sha[:2], sha[2:])


def _check_id(root: str, checkpoint_id: str) -> None:
    if not valid_id(checkpoint_id):
        raise CheckpointError(
            f"checkpoint id {checkpoint_id!r} (store {store_path(root)}) is not a valid id: "
            "use lowercase letters, digits, '.' and '-', starting with a letter or digit, at most 201"
        )


def _require_root(root: str, checkpoint_id: str, tree: str | None = None) -> None:
    if not os.path.isdir(root):
        raise CheckpointError(
            f"the volume root {root!r} is not a directory: no checkpoint {checkpoint_id!r} can be "
            "recorded or restored there; check the state volume's mountPath"
        )
    if tree is not None and not os.path.isdir(tree):
        raise CheckpointError(
            f"the work tree {tree!r} is not a directory: checkpoint {checkpoint_id!r} (store "
            f"{store_path(root)}) cannot be recorded from it or restored into it"
        )


def _skip_set(root: str, exclude: Sequence[str]) -> frozenset[str]:
    """The store, the candidates' trees and the normalized `exclude` paths; refuses a path outside
    the root or the root."""
    skip = {STORE_DIR, CANDIDATES_DIR}
    for raw in exclude:
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if raw.startswith("/") or ".." in parts or not parts or "\x00" in raw:
            raise CheckpointError(
                f"exclude path {raw!r} (store {store_path(root)}) is not a path inside the volume: "
                "write it relative to the volume's root, without '..' and not the root itself"
            )
        skip.add("/".join(parts))
    return frozenset(skip)


def _skipped(path: str, skip: frozenset[str]) -> bool:
    """Whether a relative path is excluded: a `.git` component, or at or under a skipped path."""
    if path == ROOT:
        return False
    if ".git" in path and ".git" in path.split("/"):
        return True
    if path in skip:
        return True
    slash = path.find("/")
    while slash != -1:
        if path[:slash] in skip:
            return True
        slash = path.find("/", slash + 1)
    return False


def _walk(root: str, skip: frozenset[str]) -> Iterator[tuple[str, str, os.stat_result | None]]:
    """(relative path, type, lstat) of every path under root, the root first ("."), parents before
    their contents; excluded paths and special files come as `_SKIPPED` and are not descended.
    Symlinks are never followed; a path that vanishes meanwhile is left out."""
    yield ROOT, DIR, os.lstat(root)
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as listing:
                found = list(listing)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except PermissionError as exc:
            raise CheckpointError(
                f"directory {os.path.join(root, rel_dir)!r} cannot be listed ({exc.strerror}): "
                "make it readable and searchable by the pod's user, or exclude it"
            ) from None
        for entry in found:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if entry.name == ".git" or rel in skip:
                yield rel, _SKIPPED, None
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            except PermissionError as exc:
                raise CheckpointError(
                    f"{entry.path!r} cannot be looked at ({exc.strerror}): make its directory searchable "
                    "by the pod's user, or exclude it"
                ) from None
            if stat.S_ISDIR(st.st_mode):
                stack.append(rel)
                yield rel, DIR, st
            elif stat.S_ISREG(st.st_mode):
                yield rel, FILE, st
            elif stat.S_ISLNK(st.st_mode):
                yield rel, SYMLINK, st
            else:
                yield rel, _SKIPPED, st


def _write_all(fd: int, data: bytes | memoryview) -> None:
    """All of `data` to `fd` (the one place this module writes file content)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _copy_hashing(src: int, dst: int) -> tuple[str, int]:
    """Copy `src` to `dst` to its end; the sha256 of what was copied, and its length."""
    digest = hashlib.sha256()
    size = 0
    while data := os.read(src, CHUNK):
        digest.update(data)
        _write_all(dst, data)
        size += len(data)
    return digest.hexdigest(), size


def _hash_fd(src: int) -> str:
    digest = hashlib.sha256()
    while data := os.read(src, CHUNK):
        digest.update(data)
    return digest.hexdigest()


def _hash_file(path: str) -> str | None:
    """The sha256 of a regular file's content; None when it cannot be read as one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _hash_fd(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


# --- manifests ----------------------------------------------------------------------------------


def _encode_manifest(header: dict[str, Any], entries: list[_Entry]) -> bytes:
    head = json.dumps(header, separators=(",", ":"))
    body = json.dumps(entries, separators=(",", ":"))
    return gzip.compress(f"{head}\n{body}\n".encode("ascii"), compresslevel=1, mtime=0)


def _corrupt(root: str, checkpoint_id: str, why: str) -> CheckpointCorrupt:
    return CheckpointCorrupt(
        f"checkpoint {checkpoint_id!r} in {store_path(root)}: manifest "
        f"{_manifest_path(root, checkpoint_id)} {why}; the checkpoint cannot be used: delete that "
        "manifest (or record the checkpoint again)"
    )


def _read_header(root: str, checkpoint_id: str) -> dict[str, Any]:
    """The manifest's first line only (the entries are not decompressed)."""
    path = _manifest_path(root, checkpoint_id)
    try:
        with gzip.open(path, "rb") as handle:
            line = handle.readline(MAX_HEADER_BYTES)
    except FileNotFoundError:
        raise _missing(root, checkpoint_id) from None
    except (OSError, EOFError, ValueError) as exc:  # gzip.BadGzipFile is an OSError
        raise _corrupt(root, checkpoint_id, f"cannot be read ({exc})") from None
    return _parse_header(root, checkpoint_id, line)


def _parse_header(root: str, checkpoint_id: str, line: bytes) -> dict[str, Any]:
    try:
        header = json.loads(line)
    except ValueError:
        raise _corrupt(root, checkpoint_id, "has no readable header") from None
    if not isinstance(header, dict) or header.get("version") != MANIFEST_VERSION:
        version = header.get("version") if isinstance(header, dict) else None
        raise _corrupt(root, checkpoint_id, f"has version {version!r}, not {MANIFEST_VERSION}")
    shapes: dict[str, type | tuple[type, ...]] = {
        "id": str,
        "created": (int, float),
        "files": int,
        "bytes": int,
        "owner": str,
    }
    for key, kind in shapes.items():
        if not isinstance(header.get(key), kind):
            raise _corrupt(root, checkpoint_id, f"has no valid {key!r} in its header")
    if header["id"] != checkpoint_id:
        raise _corrupt(root, checkpoint_id, f"names another checkpoint ({header['id']!r})")
    return header


def _missing(root: str, checkpoint_id: str) -> CheckpointMissing:
    return CheckpointMissing(
        f"checkpoint {checkpoint_id!r} is not in {store_path(root)} (no manifest "
        f"{_manifest_path(root, checkpoint_id)}): it was never recorded on this volume, or was pruned "
        "or deleted; record a new one"
    )


def _valid_path(path: object) -> bool:
    if not isinstance(path, str) or not path or "\x00" in path:
        return False
    return path == ROOT or _BAD_COMPONENTS.isdisjoint(path.split("/"))


def _load_manifest(root: str, checkpoint_id: str) -> _Manifest:
    """The whole manifest, every entry checked: a restore writes only where a valid one says."""
    path = _manifest_path(root, checkpoint_id)
    try:
        with open(path, "rb") as handle:
            packed = handle.read()
    except FileNotFoundError:
        raise _missing(root, checkpoint_id) from None
    except OSError as exc:
        raise _corrupt(root, checkpoint_id, f"cannot be read ({exc})") from None
    try:
        text = gzip.decompress(packed)
    except (OSError, EOFError, ValueError) as exc:
        raise _corrupt(root, checkpoint_id, f"is not a whole gzip file ({exc})") from None
    head, _, body = text.partition(b"\n")
    header = _parse_header(root, checkpoint_id, head)
    try:
        rows = json.loads(body)
    except ValueError:
        raise _corrupt(root, checkpoint_id, "has unreadable entries") from None
    if not isinstance(rows, list):
        raise _corrupt(root, checkpoint_id, "has no list of entries")
    entries: dict[str, _Entry] = {}
    for row in rows:
        entry = _entry_of(row)
        if entry is None or entry.path in entries:
            raise _corrupt(root, checkpoint_id, f"has an invalid entry {str(row)[:200]!r}")
        entries[entry.path] = entry
    for entry in entries.values():
        parent = _parent(entry.path)
        if parent is not None and (parent not in entries or entries[parent].type != DIR):
            raise _corrupt(root, checkpoint_id, f"has {entry.path!r} without its directory")
    if ROOT not in entries:
        raise _corrupt(root, checkpoint_id, "has no entry for the root")
    return _Manifest(header, entries)


def _entry_of(row: object) -> _Entry | None:
    if not isinstance(row, list) or len(row) != len(FIELDS) or not _valid_path(row[0]):
        return None
    path, kind, *numbers, value, ino, ctime_ns = row
    if set(map(type, (*numbers, ino, ctime_ns))) != {int} or not isinstance(value, str):
        return None
    if kind == FILE:
        if len(value) != 64 or value.strip(_HEX):
            return None
    elif kind == SYMLINK:
        if not value or "\x00" in value:
            return None
    elif kind != DIR:
        return None
    if path == ROOT and kind != DIR:
        return None
    mode, uid, gid, size, mtime_ns = numbers
    return _Entry(path, kind, mode & 0o7777, uid, gid, size, mtime_ns, value, ino, ctime_ns)


def _parent(path: str) -> str | None:
    if path == ROOT:
        return None
    head, _, _ = path.rpartition("/")
    return head or ROOT


def _manifest_ids(root: str) -> list[str]:
    try:
        names = os.listdir(os.path.join(store_path(root), "manifests"))
    except FileNotFoundError:
        return []
    return sorted(
        n[: -len(MANIFEST_SUFFIX)]
        for n in names
        if n.endswith(MANIFEST_SUFFIX) and valid_id(n[: -len(MANIFEST_SUFFIX)])
    )


def _headers(root: str) -> list[dict[str, Any]]:
    """The readable manifests' headers, oldest first (a damaged manifest is left out)."""
    found = []
    for checkpoint_id in _manifest_ids(root):
        try:
            found.append(_read_header(root, checkpoint_id))
        except CheckpointError:
            continue
    return sorted(found, key=lambda h: (h["created"], h["id"]))


def exists(root: str, checkpoint_id: str) -> bool:
    return valid_id(checkpoint_id) and os.path.isfile(_manifest_path(root, checkpoint_id))


def owner(root: str, checkpoint_id: str) -> str:
    """Who recorded the checkpoint (`record`'s `owner`; "" when none was given).
    Raises CheckpointMissing or CheckpointCorrupt."""
    _check_id(root, checkpoint_id)
    owner_: str = _read_header(root, checkpoint_id)["owner"]
    return owner_


def list_checkpoints(root: str) -> list[CheckpointInfo]:
    """The store's readable checkpoints, oldest first (only their headers are read)."""
    return [CheckpointInfo(h["id"], float(h["created"]), h["files"], h["bytes"]) for h in _headers(root)]


# --- recording ----------------------------------------------------------------------------------


class _Writer:
    """What one `record` call writes into the store, so that a failure can take it all back."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.store = store_path(root)
        self.tmp_dir = os.path.join(self.store, "tmp")
        self.temps: set[str] = set()
        self.new_objects: list[str] = []
        self.added_bytes = 0
        self.attempted_bytes = 0
        """Bytes written or being written, the ones a full volume refused included."""
        self.fanout: set[str] = set()

    def temp(self) -> tuple[str, int]:
        path, fd = _exclusive_temp(self.tmp_dir, "", 0o644)
        self.temps.add(path)
        return path, fd

    def store_file(self, path: str, rel: str) -> tuple[str, int, os.stat_result] | None:
        """Copy a workspace file into the objects: (sha256, size, its stat when opened); None when
        it vanished or is no longer a regular file."""
        try:
            src = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # replaced by a symlink since the listing
                return None
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise CheckpointError(
                    f"file {path!r} cannot be read ({exc.strerror}) to record checkpoint in "
                    f"{self.store}: make it readable by the pod's user, or exclude {rel!r}"
                ) from None
            raise
        try:
            st = os.fstat(src)
            if not stat.S_ISREG(st.st_mode):
                return None
            self.attempted_bytes += st.st_size
            tmp, dst = self.temp()
            try:
                sha, size = _copy_hashing(src, dst)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        self.attempted_bytes += size - st.st_size
        self._keep(tmp, sha, size)
        return sha, size, st

    def _keep(self, tmp: str, sha: str, size: int) -> None:
        """Rename a written temp into the objects, or drop it when that content is there already."""
        fanout = os.path.join(self.store, "objects", sha[:2])
        if fanout not in self.fanout:
            os.makedirs(fanout, exist_ok=True)
            self.fanout.add(fanout)
        final = os.path.join(fanout, sha[2:])
        if os.path.exists(final):
            os.unlink(tmp)
        else:
            os.replace(tmp, final)
            self.new_objects.append(final)
            self.added_bytes += size
        self.temps.discard(tmp)

    def discard(self) -> None:
        """Remove everything this call wrote: temps, and objects no manifest can refer to yet."""
        for path in [*self.temps, *self.new_objects]:
            _unlink_quietly(path)
        self.temps.clear()
        self.new_objects.clear()


def _stat_cache(root: str) -> dict[str, _Entry]:
    """The newest readable manifest's entries: a file whose stat identity is unchanged since then
    has the content it had (a damaged manifest is no cache: everything is read again)."""
    for header in reversed(_headers(root)):
        try:
            return _load_manifest(root, header["id"]).entries
        except CheckpointError:
            continue
    return {}


def _objects_present(root: str) -> set[str]:
    """The sha256 of every object in the store (one listing per fan-out directory)."""
    objects = os.path.join(store_path(root), "objects")
    present: set[str] = set()
    try:
        fanouts = os.listdir(objects)
    except FileNotFoundError:
        return present
    for fanout in fanouts:
        try:
            present.update(fanout + name for name in os.listdir(os.path.join(objects, fanout)))
        except NotADirectoryError:
            continue
    return present


def _sweep_stale_temps(directory: str) -> None:
    cutoff = time.time() - STALE_TEMP_SECONDS
    try:
        listing = list(os.scandir(directory))
    except FileNotFoundError:
        return
    for entry in listing:
        try:
            if entry.name.endswith(".tmp") and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                os.unlink(entry.path)
        except OSError:
            continue


def _make_store_parents(root: str) -> None:
    """The directories above the store that are not there yet (``.agentrun``, which holds the
    control file by default), made as the volume's root is: its permission bits and, as root, its
    owner and group. The reporter records the first checkpoint before any `main` ran, as uid 0; a
    ``.agentrun`` it made its own ``0755`` would shut out a `main` of another user, which may write
    there exactly as it may write the volume's root (docs/concepts.md#checkpoints)."""
    _make_like_root(root, os.path.dirname(STORE_DIR))


def _make_like_root(root: str, rel_dir: str) -> None:
    """`rel_dir` under `root` and its missing parents, each made as `_make_store_parents` says."""
    top = os.stat(root)
    path = root
    for part in rel_dir.split("/"):
        path = os.path.join(path, part)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        if os.geteuid() == 0:
            os.chown(path, top.st_uid, top.st_gid)
        os.chmod(path, stat.S_IMODE(top.st_mode))


StatCache = Mapping[str, _Entry]
"""What a record may trust without reading: per path, a file's content with the stat identity it
had then (`tree_cache`; by default the newest manifest)."""


def tree_cache(root: str, checkpoint_id: str, tree: str) -> StatCache:
    """Right after `restore(root, checkpoint_id, tree=tree)`: the checkpoint's files with the stat
    identity their copies in `tree` have now, so a later `record(..., tree=tree, cache=…)` reads only
    what changed in the copy since (a candidate's end: its copy's inodes are not the store's)."""
    cache: dict[str, _Entry] = {}
    for path, entry in _load_manifest(root, checkpoint_id).entries.items():
        if entry.type != FILE:
            continue
        try:
            st = os.lstat(os.path.join(tree, path))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and (st.st_size, st.st_mtime_ns) == (entry.size, entry.mtime_ns):
            cache[path] = entry._replace(ino=st.st_ino, ctime_ns=st.st_ctime_ns)
    return cache


def record(
    root: str,
    checkpoint_id: str,
    exclude: Sequence[str] = (),
    *,
    owner: str = "",
    tree: str | None = None,
    cache: StatCache | None = None,
) -> Recorded:
    """Record the tree under `root` (or under `tree`, with the store still under `root`: a
    candidate's copy) as checkpoint `checkpoint_id` (an existing one of that id is replaced). Reads
    only the files changed since the newest checkpoint of the store (or since `cache` was taken): a
    file of another tree has another inode, so the newest manifest's stat identity never vouches for
    it; one of the same size and mtime is read and its hash compared, not copied."""
    started = time.monotonic()
    _check_id(root, checkpoint_id)
    skip = _skip_set(root, exclude)
    _require_root(root, checkpoint_id, tree)
    writer = _Writer(root)
    try:
        work = root if tree is None else tree
        return _record(root, work, checkpoint_id, skip, owner, writer, started, cache)
    except BaseException as exc:
        writer.discard()
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
            raise CheckpointNoSpace(
                f"checkpoint {checkpoint_id!r} in {writer.store}: the volume is full ({exc.strerror}, "
                f"at {exc.filename or 'a store file'}): the checkpoint needed {writer.attempted_bytes} "
                "bytes of new content so far; nothing of it is kept: make room on the volume or exclude "
                "large paths that need no checkpoint"
            ) from None
        if isinstance(exc, OSError):
            raise CheckpointError(
                f"checkpoint {checkpoint_id!r} in {writer.store} could not be recorded: {exc}; "
                "nothing of it is kept"
            ) from None
        raise


def _record(
    root: str,
    tree: str,
    checkpoint_id: str,
    skip: frozenset[str],
    owner: str,
    writer: _Writer,
    started: float,
    given: StatCache | None = None,
) -> Recorded:
    _make_store_parents(root)
    for sub in ("objects", "manifests", "tmp"):
        os.makedirs(os.path.join(writer.store, sub), exist_ok=True)
    _sweep_stale_temps(writer.tmp_dir)
    cache = _stat_cache(root) if given is None else given
    present = _objects_present(root) if cache else set()
    entries: list[_Entry] = []
    total = hashed = 0
    for rel, kind, st in _walk(tree, skip):
        if kind == _SKIPPED or st is None:
            continue
        mode = stat.S_IMODE(st.st_mode)
        path = os.path.join(tree, rel)
        if kind == DIR:
            entries.append(_Entry(rel, DIR, mode, st.st_uid, st.st_gid, 0, st.st_mtime_ns, ""))
        elif kind == SYMLINK:
            try:
                target = os.readlink(path)
            except FileNotFoundError:
                continue
            entries.append(_Entry(rel, SYMLINK, mode, st.st_uid, st.st_gid, 0, st.st_mtime_ns, target))
        else:
            was = cache.get(rel)
            if was is not None and (was.type, was.size, was.mtime_ns) != (FILE, st.st_size, st.st_mtime_ns):
                was = None
            if (
                was is not None
                and was.value in present
                and (was.ino, was.ctime_ns) == (st.st_ino, st.st_ctime_ns)
            ):
                sha, size = was.value, st.st_size
            elif was is not None and was.value in present and _hash_file(path) == was.value:
                # The same size, mtime and content in another inode (a restore writes those): read,
                # not copied.
                sha, size = was.value, st.st_size
                hashed += 1
            else:
                stored = writer.store_file(path, rel)
                if stored is None:
                    continue
                sha, size, st = stored
                mode = stat.S_IMODE(st.st_mode)
                hashed += 1
            # A file that changed while it was read keeps no stat identity: the next record reads it.
            ctime_ns = st.st_ctime_ns if size == st.st_size else -1
            entries.append(
                _Entry(rel, FILE, mode, st.st_uid, st.st_gid, size, st.st_mtime_ns, sha, st.st_ino, ctime_ns)
            )
            total += size
    entries.sort(key=lambda e: e.path)
    files = sum(1 for e in entries if e.type == FILE)
    header = {
        "version": MANIFEST_VERSION,
        "id": checkpoint_id,
        "created": time.time(),
        "owner": owner,
        "files": files,
        "bytes": total,
        "entries": len(entries),
        "fields": list(FIELDS),
    }
    packed = _encode_manifest(header, entries)
    writer.attempted_bytes += len(packed)
    tmp, fd = writer.temp()
    try:
        _write_all(fd, packed)
    finally:
        os.close(fd)
    os.replace(tmp, _manifest_path(root, checkpoint_id))
    writer.temps.discard(tmp)
    return Recorded(
        id=checkpoint_id,
        files=files,
        bytes=total,
        added_bytes=writer.added_bytes + len(packed),
        hashed_files=hashed,
        seconds=time.monotonic() - started,
    )


# --- restoring ----------------------------------------------------------------------------------


class _Plan(NamedTuple):
    """What a restore changes, worked out before anything is changed."""

    delete: list[tuple[str, bool]]
    """Every current path to remove (and whether it is a directory), children before their
    directory."""
    mkdirs: list[_Entry]
    files: list[_Entry]
    stage_dirs: dict[str, str]
    """Where each file of `files` is staged: its directory, or the nearest one that exists now."""
    links: list[_Entry]
    dirs_to_settle: set[str]
    """Directories whose mode, ownership and mtime are set last (changed, or changed inside)."""


def restore(
    root: str,
    checkpoint_id: str,
    exclude: Sequence[str] = (),
    *,
    tree: str | None = None,
    base: str | None = None,
) -> Restored:
    """Put the tree under `root` (or under `tree`, from the store under `root`: a candidate's copy)
    back to checkpoint `checkpoint_id`, but for excluded paths.

    `base` names a checkpoint the tree was recorded as and may still be (a candidate's promotion:
    the iteration's start): a file whose stat identity is still the base's, and whose base content is
    the checkpoint's, is known to be the checkpoint's without reading it.

    Nothing changes unless the checkpoint can be restored whole: its manifest and every object the
    restore needs are checked, and the rewritten files staged (their content checked against their
    hash), before the first path is deleted or replaced."""
    started = time.monotonic()
    _check_id(root, checkpoint_id)
    skip = _skip_set(root, exclude)
    _require_root(root, checkpoint_id, tree)
    work = root if tree is None else tree
    manifest = _load_manifest(root, checkpoint_id)
    wanted = {p: e for p, e in manifest.entries.items() if not _skipped(p, skip)}
    known = _base_entries(root, base)
    try:
        plan = _plan(root, work, checkpoint_id, wanted, skip, known)
    except OSError as exc:
        raise CheckpointError(
            f"checkpoint {checkpoint_id!r} in {store_path(root)}: the workspace cannot be compared with "
            f"it ({exc}); the workspace is unchanged: make it readable by the pod's user"
        ) from None
    for entry in plan.files:
        if not os.path.isfile(_object_path(root, entry.value)):
            raise CheckpointCorrupt(
                f"checkpoint {checkpoint_id!r} in {store_path(root)}: object "
                f"{_object_path(root, entry.value)} (content of {entry.path!r}) is missing; the "
                "checkpoint cannot be restored: the workspace is unchanged"
            )
    as_root = os.geteuid() == 0
    loosened: dict[str, int] = {}
    staged: dict[str, str] = {}
    try:
        _loosen_dirs(work, plan, loosened, as_root)
        for entry in plan.files:
            staged[entry.path] = _stage(
                root, work, checkpoint_id, entry, plan.stage_dirs[entry.path], as_root
            )
    except BaseException as exc:
        for tmp in staged.values():
            _unlink_quietly(tmp)
        for path, mode in loosened.items():
            _chmod_quietly(path, mode)
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
            raise CheckpointNoSpace(
                f"checkpoint {checkpoint_id!r} in {store_path(root)}: the volume is full ({exc.strerror}) "
                "while staging the restore; the workspace is unchanged: make room on the volume"
            ) from None
        if isinstance(exc, OSError):
            raise CheckpointError(
                f"checkpoint {checkpoint_id!r} in {store_path(root)} could not be staged for restore: "
                f"{exc}; the workspace is unchanged"
            ) from None
        raise
    try:
        _apply(work, plan, staged, loosened, wanted, as_root)
    except OSError as exc:
        for tmp in staged.values():
            _unlink_quietly(tmp)
        raise CheckpointError(
            f"checkpoint {checkpoint_id!r} in {store_path(root)}: restoring stopped part way ({exc}); "
            "the workspace is partly restored: fix the cause and restore again (a restore can be repeated)"
        ) from None
    return Restored(
        id=checkpoint_id,
        written=len(plan.files) + len(plan.links),
        deleted=len(plan.delete),
        seconds=time.monotonic() - started,
    )


def _base_entries(root: str, base: str | None) -> dict[str, _Entry]:
    """The entries of checkpoint `base` (none when it is not given or cannot be read: the restore then
    compares contents, as without it)."""
    if base is None:
        return {}
    try:
        return dict(_load_manifest(root, base).entries)
    except CheckpointError:
        return {}


def _plan(
    root: str,
    tree: str,
    checkpoint_id: str,
    wanted: dict[str, _Entry],
    skip: frozenset[str],
    known: dict[str, _Entry] | None = None,
) -> _Plan:
    current: dict[str, tuple[str, os.stat_result]] = {}
    protected: set[str] = set()
    """Directories holding something a restore never touches (excluded or special): kept."""
    untouchable: dict[str, str] = {}
    for rel, kind, st in _walk(tree, skip):
        if kind == _SKIPPED:
            untouchable[rel] = "a special file" if st is not None else "excluded"
            parent = _parent(rel)
            while parent is not None and parent not in protected:
                protected.add(parent)
                parent = _parent(parent)
        elif st is not None:
            current[rel] = (kind, st)

    def refuse(path: str, why: str) -> CheckpointError:
        return CheckpointError(
            f"checkpoint {checkpoint_id!r} in {store_path(root)}: {path!r} cannot be restored: {why}; "
            "the workspace is unchanged: move that away, or restore with a matching exclude"
        )

    as_root = os.geteuid() == 0
    remove: set[str] = set()
    files: list[_Entry] = []
    links: list[_Entry] = []
    mkdirs: list[_Entry] = []
    settle: set[str] = set()
    for path, entry in wanted.items():
        if path in untouchable:
            raise refuse(path, f"{untouchable[path]} is there now")
        now = current.get(path)
        if now is not None and now[0] != entry.type:
            if path in protected:
                raise refuse(path, "it is a directory now, holding excluded paths or special files")
            remove.add(path)
            now = None
        if entry.type == DIR:
            if now is None:
                mkdirs.append(entry)
                settle.add(path)
            elif _differs(entry, now[1], as_root, with_mtime=True):
                settle.add(path)
        elif entry.type == SYMLINK:
            if (
                now is None
                or os.readlink(os.path.join(tree, path)) != entry.value
                or _differs(entry, now[1], as_root, with_mtime=True)
            ):
                links.append(entry)
        elif now is None or not _same_file(tree, entry, now[1], as_root, (known or {}).get(path)):
            files.append(entry)
    remove.update(p for p in current if p not in wanted and p not in protected)
    # Everything under a removed path goes with it.
    gone = [p for p in current if p in remove or (remove and any(a in remove for a in _ancestors(p)))]
    delete = sorted(((p, current[p][0] == DIR) for p in gone), key=lambda d: (-d[0].count("/"), d[0]))
    stage_dirs = {}
    for entry in files:
        directory = _parent(entry.path) or ROOT
        while directory != ROOT and (directory in remove or current.get(directory, ("",))[0] != DIR):
            directory = _parent(directory) or ROOT
        stage_dirs[entry.path] = directory
        settle.add(directory)
    for path in [*(d[0] for d in delete), *(e.path for e in (*mkdirs, *files, *links))]:
        parent = _parent(path)
        if parent is not None:
            settle.add(parent)
    # Only directories that are there after the restore: the checkpoint's, and the kept ones.
    settle = {
        p
        for p in settle
        if (p in wanted and wanted[p].type == DIR) or (p not in wanted and p not in remove and p in current)
    }
    mkdirs.sort(key=lambda e: e.path)
    return _Plan(delete, mkdirs, files, stage_dirs, links, settle)


def _ancestors(path: str) -> Iterator[str]:
    parent = _parent(path)
    while parent is not None and parent != ROOT:
        yield parent
        parent = _parent(parent)


def _differs(entry: _Entry, st: os.stat_result, as_root: bool, with_mtime: bool) -> bool:
    return (
        (entry.type != SYMLINK and stat.S_IMODE(st.st_mode) != entry.mode)
        or (as_root and (st.st_uid, st.st_gid) != (entry.uid, entry.gid))
        or (with_mtime and st.st_mtime_ns != entry.mtime_ns)
    )


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _same_file(
    root: str, entry: _Entry, st: os.stat_result, as_root: bool, base: _Entry | None = None
) -> bool:
    """Whether a current file is the checkpoint's: the same stat identity, or the same size, mode,
    ownership and mtime and either the stat identity `base` recorded with the same content, or, read
    to be sure, the same content."""
    if _identity(st) == (entry.ino, entry.size, entry.mtime_ns, entry.ctime_ns):
        return True
    if st.st_size != entry.size or _differs(entry, st, as_root, with_mtime=True):
        return False
    if (
        base is not None
        and base.type == FILE
        and base.value == entry.value
        and _identity(st) == (base.ino, base.size, base.mtime_ns, base.ctime_ns)
    ):
        return True
    return _hash_file(os.path.join(root, entry.path)) == entry.value


def _loosen_dirs(root: str, plan: _Plan, loosened: dict[str, int], as_root: bool) -> None:
    """Without root, a directory the restore changes must be writable and searchable by its owner
    for now: its own mode is set back last (`_apply`), or on failure."""
    if as_root:
        return
    for rel in sorted(plan.dirs_to_settle | {p for p, is_dir in plan.delete if is_dir}):
        path = os.path.join(root, rel)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o300 != 0o300:
            loosened[path] = stat.S_IMODE(st.st_mode)
            os.chmod(path, stat.S_IMODE(st.st_mode) | 0o700)


def _stage(root: str, tree: str, checkpoint_id: str, entry: _Entry, directory: str, as_root: bool) -> str:
    """A temp copy of the entry's object, its content checked, in `directory` (its parent, or the
    nearest that exists: the same filesystem), with its mode, ownership and mtime: renamed into
    place later."""
    obj = _object_path(root, entry.value)
    try:
        src = os.open(obj, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CheckpointCorrupt(
            f"checkpoint {checkpoint_id!r} in {store_path(root)}: object {obj} (content of "
            f"{entry.path!r}) is missing; the checkpoint cannot be restored: the workspace is unchanged"
        ) from None
    try:
        tmp, dst = _exclusive_temp(os.path.join(tree, directory), _RESTORE_TEMP, 0o600)
        try:
            sha, _size = _copy_hashing(src, dst)
            if sha != entry.value:
                raise CheckpointCorrupt(
                    f"checkpoint {checkpoint_id!r} in {store_path(root)}: object {obj} (content of "
                    f"{entry.path!r}) does not match its hash (it has {sha}); the checkpoint cannot "
                    "be restored: the workspace is unchanged"
                )
            if as_root:
                os.fchown(dst, entry.uid, entry.gid)
            os.fchmod(dst, entry.mode)
            os.utime(dst, ns=(entry.mtime_ns, entry.mtime_ns))
        except BaseException:
            os.close(dst)
            _unlink_quietly(tmp)
            raise
        os.close(dst)
    finally:
        os.close(src)
    return tmp


def _exclusive_temp(directory: str, prefix: str, mode: int) -> tuple[str, int]:
    """A new file of a name nobody else uses (a pid repeats across pods: a random part too)."""
    while True:
        path = os.path.join(directory, f"{prefix}{os.getpid()}-{os.urandom(6).hex()}.tmp")
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
            return path, os.open(path, flags, mode)
        except FileExistsError:
            continue


def _apply(
    root: str,
    plan: _Plan,
    staged: dict[str, str],
    loosened: dict[str, int],
    wanted: dict[str, _Entry],
    as_root: bool,
) -> None:
    for rel, is_dir in plan.delete:
        if is_dir:
            os.rmdir(os.path.join(root, rel))
        else:
            os.unlink(os.path.join(root, rel))
    for entry in plan.mkdirs:
        os.mkdir(os.path.join(root, entry.path), 0o700)
    for entry in plan.files:
        os.replace(staged.pop(entry.path), os.path.join(root, entry.path))
    for entry in plan.links:
        path = os.path.join(root, entry.path)
        tmp = os.path.join(os.path.dirname(path), f"{_RESTORE_TEMP}{os.getpid()}-{os.urandom(6).hex()}")
        os.symlink(entry.value, tmp)
        os.replace(tmp, path)
        if as_root:
            os.lchown(path, entry.uid, entry.gid)
        os.utime(path, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=False)
    for rel in sorted(plan.dirs_to_settle, key=lambda p: (-p.count("/") if p != ROOT else 1, p)):
        directory = wanted.get(rel)
        path = os.path.join(root, rel)
        if directory is None:  # a kept directory that is not in the checkpoint: its mode as it was
            if path in loosened:
                os.chmod(path, loosened[path])
            continue
        if as_root:
            os.lchown(path, directory.uid, directory.gid)
        os.chmod(path, directory.mode)
        os.utime(path, ns=(directory.mtime_ns, directory.mtime_ns), follow_symlinks=False)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _chmod_quietly(path: str, mode: int) -> None:
    with contextlib.suppress(OSError):
        os.chmod(path, mode)


# --- pruning and comparing ----------------------------------------------------------------------


def prune(root: str, prefix: str, keep: int) -> list[str]:
    """Keep the checkpoints of the newest `keep` iterations whose ids start with `prefix`, delete the
    older ones, then (only when one was deleted) every object no remaining manifest refers to. The
    pruned ids, oldest iteration first.

    An iteration's ids are ``<prefix><n>`` (its start) and ``<prefix><n>c<i>`` (candidate i's end,
    loop.candidates): they are kept or pruned together, iterations ordered by `n`. An id of another
    shape after the prefix was made by no loop: it is left alone. The candidates' copies of a
    pruned iteration (``CANDIDATES_DIR/<id>``) go with it."""
    if keep < 0:
        raise ValueError(f"keep must be 0 or more, not {keep}")
    groups: dict[int, list[str]] = {}
    for header in _headers(root):
        iteration = iteration_of(header["id"], prefix)
        if iteration is not None:
            groups.setdefault(iteration, []).append(header["id"])
    order = sorted(groups)
    pruned = [i for n in order[: max(0, len(order) - keep)] for i in groups[n]]
    for checkpoint_id in pruned:
        _unlink_quietly(_manifest_path(root, checkpoint_id))
        remove_tree(os.path.join(root, CANDIDATES_DIR, checkpoint_id))
    if pruned:
        referenced: set[str] = set()
        for checkpoint_id in _manifest_ids(root):
            manifest = _load_manifest(root, checkpoint_id)  # a damaged one: no object is deleted
            referenced.update(e.value for e in manifest.entries.values() if e.type == FILE)
        for sha in _objects_present(root) - referenced:
            _unlink_quietly(_object_path(root, sha))
    return pruned


def iteration_of(checkpoint_id: str, prefix: str) -> int | None:
    """The iteration `n` of ``<prefix><n>`` or ``<prefix><n>c<i>``; None for any other id."""
    if not checkpoint_id.startswith(prefix):
        return None
    number, candidate, index = checkpoint_id[len(prefix) :].partition("c")
    if not _digits(number) or (candidate and not _digits(index)):
        return None
    return int(number)


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def candidate_tree(root: str, checkpoint_id: str, index: int) -> str:
    """Where candidate `index` of the iteration that starts at `checkpoint_id` works: its `main`
    mounts this directory (a subPathExpr) as the volume."""
    return os.path.join(root, CANDIDATES_DIR, checkpoint_id, str(index))


def fresh_tree(root: str, rel_dir: str) -> str:
    """`rel_dir` under `root`, there and empty (whatever an earlier attempt left is removed); its
    missing parents made as the root is (`_make_store_parents`). Its path."""
    parts = [p for p in rel_dir.split("/") if p]
    if not parts or _BAD_COMPONENTS.intersection(parts) or rel_dir.startswith("/"):
        raise CheckpointError(f"{rel_dir!r} is not a directory inside the volume {root!r}")
    _make_like_root(root, "/".join(parts))
    path = root
    for part in parts:  # a symlink planted on the way would take the emptying elsewhere
        path = os.path.join(path, part)
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise CheckpointError(f"{path!r} is not a directory (a symlink or a file is there): remove it")
    with os.scandir(path) as listing:
        found = list(listing)
    for entry in found:
        if entry.is_dir(follow_symlinks=False):
            remove_tree(entry.path, strict=True)
        else:
            os.unlink(entry.path)
    return path


def remove_tree(path: str, strict: bool = False) -> None:
    """Remove `path` and everything under it (never following a symlink); a directory without write
    permission is made writable first (an owner's own may be). Errors are ignored unless `strict`."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(path)
            return
        _chmod_writable(path)
        for top, dirs, _files in os.walk(path, topdown=True):
            for name in dirs:
                _chmod_writable(os.path.join(top, name))
        for top, dirs, files in os.walk(path, topdown=False):
            for name in files:
                os.unlink(os.path.join(top, name))
            for name in dirs:
                sub = os.path.join(top, name)
                if os.path.islink(sub):
                    os.unlink(sub)
                else:
                    os.rmdir(sub)
        os.rmdir(path)
    except FileNotFoundError:
        return
    except OSError:
        if strict:
            raise


def _chmod_writable(path: str) -> None:
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o700 != 0o700:
        os.chmod(path, stat.S_IMODE(st.st_mode) | 0o700)


@contextlib.contextmanager
def locked(root: str) -> Iterator[None]:
    """Hold the store's lock (an exclusive `flock` of `LOCK_FILE`) for the block: the N candidate pods
    of one iteration record and restore in the same store at the same time."""
    import fcntl  # only candidate pods lock: the others import nothing more

    _make_store_parents(root)
    os.makedirs(store_path(root), exist_ok=True)
    fd = os.open(os.path.join(store_path(root), LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def tree_digest(root: str, exclude: Sequence[str] = ()) -> str:
    """A sha256 over every path's (path, type, mode, content sha256 or link target), with the
    exclusions of `record`: two trees a restore should make equal have the same digest."""
    digest = hashlib.sha256()
    rows = []
    for rel, kind, st in _walk(root, _skip_set(root, exclude)):
        if kind == _SKIPPED or st is None:
            continue
        path = os.path.join(root, rel)
        value = ""
        if kind == FILE:
            value = _hash_file(path) or "unreadable"
        elif kind == SYMLINK:
            value = os.readlink(path)
        rows.append(f"{rel}\x00{kind}\x00{stat.S_IMODE(st.st_mode):o}\x00{value}\n")
    for row in sorted(rows):
        digest.update(row.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()
