"""The pure parts of the image build on a Docker engine: the base images' recipe and layout, the
operator image's build inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrun_devcluster import baseimages, imagebuild

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------------- base images


def test_debian_mirror_from_deb822_and_one_line_sources() -> None:
    deb822 = "Types: deb\n# comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
    assert baseimages.debian_mirror([deb822]) == "http://mirror.example/debian"
    one_line = "deb [arch=amd64] http://m2.example/debian/ bookworm main\n"
    assert (
        baseimages.debian_mirror(["deb https://x/apt cloud-sdk main\n", one_line])
        == "http://m2.example/debian"
    )
    security = "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n"
    assert baseimages.debian_mirror([security]) == baseimages.DEFAULT_MIRROR


def test_python_recipe_changes_with_its_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(baseimages, "HOST_CA_DIR", tmp_path)
    ca = tmp_path / "proxy.crt"
    ca.write_text("A")
    first = baseimages.python_recipe("http://a/debian", [ca])
    assert first == baseimages.python_recipe("http://a/debian", [ca])
    assert first != baseimages.python_recipe("http://b/debian", [ca])
    assert first != baseimages.python_recipe("http://a/debian", [])
    ca.write_text("B")
    assert first != baseimages.python_recipe("http://a/debian", [ca])


def test_git_recipe_names_the_mirror_and_packages() -> None:
    first = baseimages.git_recipe("http://a/debian")
    assert first == baseimages.git_recipe("http://a/debian") != baseimages.git_recipe("http://b/debian")
    assert first != baseimages.python_recipe("http://a/debian", [])
    assert "git" in baseimages.GIT_PACKAGES


def test_busybox_rootfs_layout(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "busybox").write_text("")
    baseimages.busybox_rootfs(tmp_path, ["busybox", "sh", "wc", "date"])
    assert (tmp_path / "bin" / "sh").readlink() == Path("busybox")
    assert not (tmp_path / "bin" / "busybox").is_symlink()
    assert (tmp_path / "tmp").stat().st_mode & 0o7777 == 0o1777
    assert (tmp_path / "etc" / "passwd").read_text().startswith("root:x:0:0:")


# ----------------------------------------------------------------------------------- the image build


def test_pinned_base_is_the_dockerfile_default() -> None:
    base = imagebuild.pinned_base((REPO / "Dockerfile").read_text())
    assert base.startswith("python:3.11") and "@sha256:" in base


def test_dockerignore_lets_in_exactly_what_the_hash_covers() -> None:
    lines = [ln for ln in (REPO / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    allowed = sorted(ln[1:].rstrip("/") for ln in lines if ln.startswith("!"))
    assert lines[0] == "*"
    assert allowed == sorted([*imagebuild.CONTEXT_FILES, *imagebuild.CONTEXT_DIRS])


def test_source_hash_follows_file_contents_base_and_args(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("1")
    files = [tmp_path / "a"]
    first = imagebuild.source_hash(tmp_path, files, "sha256:base", ["VERSION=1"])
    assert first == imagebuild.source_hash(tmp_path, files, "sha256:base", ["VERSION=1"])
    assert first != imagebuild.source_hash(tmp_path, files, "sha256:other", ["VERSION=1"])
    assert first != imagebuild.source_hash(tmp_path, files, "sha256:base", ["VERSION=2"])
    (tmp_path / "a").write_text("2")
    assert first != imagebuild.source_hash(tmp_path, files, "sha256:base", ["VERSION=1"])


def test_context_files_leave_out_bytecode_and_egg_info() -> None:
    files = imagebuild.context_files(REPO)
    assert REPO / "operator" / "agentrun_operator" / "cli.py" in files
    assert not [f for f in files if "__pycache__" in f.parts or any(p.endswith(".egg-info") for p in f.parts)]
