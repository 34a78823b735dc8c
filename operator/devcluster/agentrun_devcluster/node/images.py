"""Images on the real node without a registry: the pause image made here, the rest from Docker.

The sandbox ("pause") image is a tiny static binary built with the control plane tools (it sleeps,
reaps the children it inherits as PID 1 of a pod that shares its process namespace, and exits on
SIGTERM), written as an OCI archive. busybox and the operator image come from the local Docker
engine (`agentrun dev image --with-busybox` makes them from Debian packages and the Dockerfile) via
`docker save`. Each is imported into the node's containerd once per image id.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from agentrun_devcluster import toolchain
from agentrun_devcluster.node.config import PAUSE_IMAGE
from agentrun_devcluster.node.host import NodeUnavailable
from agentrun_devcluster.node.ociimage import Entry, full_reference, oci_archive, write_archive

Ctr = Callable[..., subprocess.CompletedProcess[bytes]]
Progress = Callable[[str], None]


class ImageImportError(NodeUnavailable):
    """An image could not be put on the node; the message says which and why."""


def _stamp(images_dir: Path, ref: str) -> Path:
    return images_dir / (re.sub(r"[^A-Za-z0-9_.-]", "_", ref) + ".imported")


def _present(ctr: Ctr, ref: str) -> bool:
    listed = ctr("images", "ls", "-q")
    names = listed.stdout.decode().split() if listed.returncode == 0 else []
    return ref in names or full_reference(ref) in names


def _import(ctr: Ctr, archive: bytes, ref: str) -> None:
    done = ctr("images", "import", "--no-unpack=false", "-", stdin=archive)
    if done.returncode != 0:
        raise ImageImportError(f"ctr images import of {ref} failed: {done.stderr.decode().strip()[-300:]}")


def pause_archive() -> bytes:
    binary = toolchain.bin_dir() / "pause"
    if not binary.is_file():
        raise ImageImportError(f"the pause binary is not built ({binary}): run `agentrun dev tools`")
    return oci_archive(PAUSE_IMAGE, {"pause": Entry(binary.read_bytes(), 0o755)}, ["/pause"])


def docker_image_id(ref: str) -> str | None:
    from agentrun_devcluster import dockerengine

    done = subprocess.run(
        [dockerengine.docker_cli(), "image", "inspect", "--format", "{{.Id}}", ref],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def import_images(ctr: Ctr, images_dir: Path, refs: list[str], say: Progress) -> None:
    """Import the pause image and `refs` (from Docker) unless containerd has that version already."""
    images_dir.mkdir(parents=True, exist_ok=True)
    archive = pause_archive()
    if write_archive(images_dir / "pause.tar", archive) or not _present(ctr, PAUSE_IMAGE):
        _import(ctr, archive, PAUSE_IMAGE)
        say(f"  imported {PAUSE_IMAGE} (made here)")
    for ref in refs:
        image_id = docker_image_id(ref)
        if image_id is None:
            raise ImageImportError(
                f"image {ref} is not in the local Docker engine: run `make image` (it builds the operator "
                "image and busybox:1.36 from Debian packages), then `agentrun dev up --runtime kubelet`"
            )
        stamp = _stamp(images_dir, ref)
        if stamp.exists() and stamp.read_text() == image_id and _present(ctr, ref):
            continue
        from agentrun_devcluster import dockerengine

        saved = subprocess.run([dockerengine.docker_cli(), "save", ref], capture_output=True, check=False)
        if saved.returncode != 0:
            raise ImageImportError(f"docker save {ref} failed: {saved.stderr.decode().strip()[-300:]}")
        _import(ctr, saved.stdout, ref)
        stamp.write_text(image_id)
        say(f"  imported {ref} ({image_id[:19]}) from Docker")
