"""The local base images: made once and then reused, and a failed build says why in one line while
the base made before stays usable."""

from __future__ import annotations

import pytest

from agentrun_devcluster import baseimages, dockerengine


def test_bases_are_cached(docker_image: str) -> None:
    messages: list[str] = []
    assert baseimages.ensure_busybox(messages.append) == "busybox:1.36"
    assert messages == ["base busybox:1.36: present"]
    if dockerengine.image_exists(baseimages.PYTHON_BASE):
        messages.clear()
        assert baseimages.ensure_python_base(messages.append) == baseimages.PYTHON_BASE
        assert len(messages) == 1 and messages[0].startswith(f"base {baseimages.PYTHON_BASE}: cached")


def test_a_failed_base_build_is_one_line(docker_image: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(baseimages, "host_mirror", lambda: "http://mirror.invalid/debian")
    with pytest.raises(baseimages.BaseImageError) as info:
        baseimages.ensure_python_base()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("debootstrap bookworm from http://mirror.invalid/debian failed (exit 1): ")
    proc = dockerengine.docker("run", "--rm", docker_image, "--version")
    assert proc.returncode == 0, "the image built before is untouched"
