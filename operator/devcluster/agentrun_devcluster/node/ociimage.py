"""Container images written as OCI archives without any engine: the node's pause image and busybox.

`ctr images import` reads an OCI image layout in a tar (`oci-layout`, `index.json`, blobs by
digest). One layer, one config, one manifest; the files and their modes are given, owned by root,
with a fixed modification time so the same input gives the same digests (an unchanged image is not
imported twice).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MTIME = 0


@dataclass(frozen=True)
class Entry:
    """A file (content), a directory (content None, is_dir) or a symlink (target) in the layer."""

    content: bytes | None = None
    mode: int = 0o755
    target: str | None = None
    is_dir: bool = False


def _tar_bytes(entries: Mapping[str, Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            entry = entries[name]
            info = tarfile.TarInfo(name.lstrip("/"))
            info.mtime, info.uid, info.gid, info.mode = MTIME, 0, 0, entry.mode
            if entry.target is not None:
                info.type, info.linkname = tarfile.SYMTYPE, entry.target
                tar.addfile(info)
            elif entry.is_dir:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                data = entry.content or b""
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def full_reference(ref: str) -> str:
    """The name containerd and the kubelet use for `ref` (Docker's short names normalised)."""
    if "/" not in ref:
        return f"docker.io/library/{ref}"
    first = ref.split("/", 1)[0]
    if "." in first or ":" in first or first == "localhost":
        return ref
    return f"docker.io/{ref}"


def oci_archive(
    ref: str, entries: Mapping[str, Entry], entrypoint: list[str], env: list[str] | None = None
) -> bytes:
    """A tar of an OCI image layout holding one image named `ref` (e.g. `busybox:1.36`)."""
    layer = _tar_bytes(entries)
    config = _json(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "Env": env or []},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
            "history": [{"created_by": "agentrun devcluster", "created": "1970-01-01T00:00:00Z"}],
            "created": "1970-01-01T00:00:00Z",
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _digest(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _digest(layer),
                    "size": len(layer),
                }
            ],
        }
    )
    name = full_reference(ref)
    index = _json(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1],
                    },
                }
            ],
        }
    )
    outer: dict[str, Entry] = {
        "oci-layout": Entry(_json({"imageLayoutVersion": "1.0.0"}), 0o644),
        "index.json": Entry(index, 0o644),
        "blobs": Entry(is_dir=True),
        "blobs/sha256": Entry(is_dir=True),
    }
    for blob in (layer, config, manifest):
        outer["blobs/sha256/" + _digest(blob).split(":", 1)[1]] = Entry(blob, 0o644)
    return _tar_bytes(outer)


def write_archive(path: Path, data: bytes) -> bool:
    """Write `data` to `path` unless it already holds exactly that; True when written."""
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return True
