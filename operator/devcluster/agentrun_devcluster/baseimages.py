"""Base images made from Debian packages, for hosts where no image registry is reachable.

- `agentrun-local/python:3.11-bookworm`: Debian bookworm (`debootstrap --variant=minbase`) with
  python3 (3.11), pip, venv and `python` (python-is-python3); the Dockerfile's
  `--build-arg PYTHON_IMAGE=` takes it in place of the pinned python:3.11-slim-bookworm.
- `busybox:1.36`: Debian's `busybox-static` with its applet links, so the examples' `busybox:1.36`
  runs on the real node unchanged.
- `agentrun-local/git:bookworm`: Debian bookworm (minbase) with git, the image of
  examples/git-loop.yaml. (Debian bookworm ships busybox 1.35; the tag is the one the
  examples name.) An existing `busybox:1.36` (e.g. pulled from a registry) is never replaced.

Packages come from the host's configured Debian mirror. The Python base also trusts the host's own
CA certificates (`/usr/local/share/ca-certificates/`), so a build behind a TLS-inspecting proxy can
still download wheels from PyPI. Each image is built once: the Python base also carries a tag with
the hash of its recipe (mirror, packages, those certificates), rebuilt only when the recipe changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from agentrun_devcluster import dockerengine as engine
from agentrun_devcluster.dockerengine import EngineUnavailable, Progress

PYTHON_BASE = "agentrun-local/python:3.11-bookworm"
BUSYBOX = "busybox:1.36"
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
GIT_IMAGE = "agentrun-local/git:bookworm"
GIT_PACKAGES = ("git", "ca-certificates")
PYTHON_PACKAGES = ("python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RECIPE_VERSION = 1
"""Bumped when the way a base is made changes, so a cached one is rebuilt."""

HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
_ONE_LINE_DEB = re.compile(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)")


class BaseImageError(EngineUnavailable):
    """A base image could not be made; the message says why, in one line."""


def debian_mirror(sources: Iterable[str]) -> str:
    """The host's Debian mirror for bookworm from apt source files' texts (deb822 or one-line)."""
    for text in sources:
        for match in (_ONE_LINE_DEB.match(line) for line in text.splitlines()):
            if match and match.group(2) == SUITE and "/debian" in match.group(1):
                return match.group(1).rstrip("/")
        for stanza in re.split(r"\n\s*\n", text):
            fields = dict(
                (k.strip().lower(), v.strip())
                for k, _, v in (
                    line.partition(":") for line in stanza.splitlines() if not line.startswith("#")
                )
                if v
            )
            uris, suites = fields.get("uris", "").split(), fields.get("suites", "").split()
            if SUITE in suites:
                for uri in uris:
                    if uri.rstrip("/").endswith("/debian"):
                        return str(uri).rstrip("/")
    return DEFAULT_MIRROR


def host_mirror() -> str:
    paths = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    texts = []
    for path in paths:
        try:
            texts.append(path.read_text(errors="replace"))
        except OSError:
            continue
    return debian_mirror(texts)


def host_ca_files() -> list[Path]:
    return sorted(p for p in HOST_CA_DIR.rglob("*.crt") if p.is_file()) if HOST_CA_DIR.is_dir() else []


def python_recipe(mirror: str, ca_files: Iterable[Path] = ()) -> str:
    """The hash that names a Python base's recipe (suite, mirror, packages, host CAs, version)."""
    cas = {str(p.relative_to(HOST_CA_DIR)): hashlib.sha256(p.read_bytes()).hexdigest() for p in ca_files}
    doc = {"v": RECIPE_VERSION, "suite": SUITE, "mirror": mirror, "packages": PYTHON_PACKAGES, "cas": cas}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def _run(argv: list[str], what: str, timeout: float = 1800, cwd: Path | None = None) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise BaseImageError(f"{what} timed out after {timeout:.0f}s") from None
    except FileNotFoundError:
        raise BaseImageError(f"{what}: `{argv[0]}` is not installed on this host") from None
    if proc.returncode != 0:
        # the last line on stderr (debootstrap's `E: ...`), else on stdout
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()] or [
            ln for ln in proc.stdout.splitlines() if ln.strip()
        ]
        raise BaseImageError(f"{what} failed (exit {proc.returncode}): {lines[-1] if lines else 'no output'}")


def _import(rootfs: Path, tags: list[str], changes: list[str]) -> None:
    """`tar` the rootfs into `docker import` (numeric owners kept), then tag it."""
    try:
        tar = subprocess.Popen(
            ["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE
        )
    except FileNotFoundError:
        raise BaseImageError(f"docker import of {tags[0]}: `tar` is not installed on this host") from None
    argv = [engine.docker_cli(), "import"]
    for change in changes:
        argv += ["--change", change]
    proc = subprocess.run(
        [*argv, "-", tags[0]], stdin=tar.stdout, capture_output=True, text=True, check=False
    )
    assert tar.stdout is not None
    tar.stdout.close()
    tar.wait()
    if proc.returncode != 0 or tar.returncode != 0:
        raise BaseImageError(f"docker import of {tags[0]} failed: {(proc.stderr or 'tar failed').strip()}")
    for tag in tags[1:]:
        _run([engine.docker_cli(), "tag", tags[0], tag], f"docker tag {tag}")


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise BaseImageError(f"making {what} needs root (debootstrap/chroot and dpkg); run as root")


def _cached(image: str, recipe_tag: str, say: Progress) -> bool:
    """Whether the image of this recipe was made already (then `image` is tagged to it)."""
    if not engine.image_exists(recipe_tag):
        return False
    if not engine.image_exists(image):
        _run([engine.docker_cli(), "tag", recipe_tag, image], f"docker tag {image}")
    say(f"base {image}: cached ({recipe_tag})")
    return True


def _debootstrap_image(
    image: str,
    recipe_tag: str,
    packages: Iterable[str],
    mirror: str,
    cmd: str,
    prefix: str,
    say: Progress,
    customize: Callable[[Path], None] | None = None,
) -> None:
    """Make `image` (and `recipe_tag`) from a Debian minbase with `packages`, `customize`d, without
    apt's caches: the local bases' one recipe (root, debootstrap from Debian's packages)."""
    _need_root(image)
    if shutil.which("debootstrap") is None:
        engine.apt_install(["debootstrap"], f"making {image}", say)
    with tempfile.TemporaryDirectory(prefix=prefix, dir=engine.state_dir()) as tmp:
        rootfs = Path(tmp) / "rootfs"
        say(f"base {image}: debootstrap {SUITE} from {mirror} (a few minutes)")
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(packages)}",
                SUITE,
                str(rootfs),
                mirror,
            ],
            f"debootstrap {SUITE} from {mirror}",
        )
        if customize is not None:
            customize(rootfs)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / junk).glob("*"):
                if entry.is_file():
                    entry.unlink()
        shutil.rmtree(rootfs / "debootstrap", ignore_errors=True)
        say(f"base {image}: docker import")
        _import(rootfs, [recipe_tag, image], [f"ENV PATH={SYSTEM_PATH}", "ENV LANG=C.UTF-8", f"CMD {cmd}"])


def ensure_python_base(progress: Progress | None = None) -> str:
    """The local Python base (built once per recipe); returns its tag."""
    say = progress or (lambda _m: None)
    engine.ensure_engine(say)
    mirror = host_mirror()
    ca_files = host_ca_files()
    recipe_tag = f"{PYTHON_BASE}-{python_recipe(mirror, ca_files)}"
    if _cached(PYTHON_BASE, recipe_tag, say):
        return PYTHON_BASE

    def add_host_cas(rootfs: Path) -> None:
        if not ca_files:
            return
        for ca in ca_files:
            target = rootfs / "usr/local/share/ca-certificates" / ca.relative_to(HOST_CA_DIR)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ca, target)
        _run(["chroot", str(rootfs), "update-ca-certificates"], "update-ca-certificates in the base")

    _debootstrap_image(
        PYTHON_BASE, recipe_tag, PYTHON_PACKAGES, mirror, '["python3"]', "agentrun-base-", say, add_host_cas
    )
    return PYTHON_BASE


def git_recipe(mirror: str) -> str:
    """The hash that names the git image's recipe (suite, mirror, packages, version)."""
    doc = {"v": RECIPE_VERSION, "suite": SUITE, "mirror": mirror, "packages": GIT_PACKAGES}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def ensure_git_image(progress: Progress | None = None) -> str:
    """`agentrun-local/git:bookworm`: Debian bookworm (minbase) with git, for examples/git-loop.yaml
    on a real node (built once per recipe, like the Python base); returns its tag."""
    say = progress or (lambda _m: None)
    engine.ensure_engine(say)
    mirror = host_mirror()
    recipe_tag = f"{GIT_IMAGE}-{git_recipe(mirror)}"
    if not _cached(GIT_IMAGE, recipe_tag, say):
        _debootstrap_image(GIT_IMAGE, recipe_tag, GIT_PACKAGES, mirror, '["sh"]', "agentrun-git-", say)
    return GIT_IMAGE


def busybox_rootfs(rootfs: Path, applets: Iterable[str]) -> None:
    """Lay out a busybox image: /bin/<applet> links to busybox, passwd/group, /tmp, /root, /var."""
    bin_dir = rootfs / "bin"
    for applet in applets:
        link = bin_dir / applet
        if applet != "busybox" and not link.exists():
            link.symlink_to("busybox")
    for directory, mode in (
        ("tmp", 0o1777),
        ("root", 0o700),
        ("var", 0o755),
        ("etc", 0o755),
        ("home", 0o755),
    ):
        (rootfs / directory).mkdir(exist_ok=True)
        (rootfs / directory).chmod(mode)
    (rootfs / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n"
    )
    (rootfs / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")


def ensure_busybox(progress: Progress | None = None) -> str:
    """`busybox:1.36` from Debian's busybox-static (kept when one exists); returns the tag."""
    say = progress or (lambda _m: None)
    engine.ensure_engine(say)
    if engine.image_exists(BUSYBOX):
        say(f"base {BUSYBOX}: present")
        return BUSYBOX
    _need_root(BUSYBOX)
    with tempfile.TemporaryDirectory(prefix="agentrun-busybox-", dir=engine.state_dir()) as tmp:
        work = Path(tmp)
        _run(["apt-get", "download", "busybox-static"], "apt-get download busybox-static", 300, cwd=work)
        deb = next(work.glob("busybox-static_*.deb"), None)
        if deb is None:
            raise BaseImageError("apt-get download busybox-static left no .deb")
        rootfs = work / "rootfs"
        _run(["dpkg-deb", "-x", str(deb), str(rootfs)], "dpkg-deb -x busybox-static")
        shutil.rmtree(rootfs / "usr" / "share", ignore_errors=True)
        binary = rootfs / "bin" / "busybox"
        listing = subprocess.run([str(binary), "--list"], capture_output=True, text=True, check=False)
        if listing.returncode != 0:
            raise BaseImageError(f"{binary} --list failed: {listing.stderr.strip()}")
        busybox_rootfs(rootfs, listing.stdout.split())
        say(f"base {BUSYBOX}: docker import of Debian's busybox-static ({deb.name})")
        _import(rootfs, [BUSYBOX], [f"ENV PATH={SYSTEM_PATH}", 'CMD ["sh"]'])
    return BUSYBOX
