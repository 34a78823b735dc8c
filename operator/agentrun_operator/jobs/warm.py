"""PLACEHOLDER until the supervisor branch lands: the names the builder uses."""

from __future__ import annotations

from typing import Final

WARM_SUBPATH: Final = "warm"
WARM_DIR: Final = "/agentrun-meta/warm"
WARM_MAIN_MOUNT: Final = "/.agentrun-warm"
WARM_LOOP_SCRIPT: Final = "placeholder"


def warm_main_command(command: list[str], args: list[str]) -> list[str]:
    return ["sh", "-c", WARM_LOOP_SCRIPT, "agentrun-warm", *command, *args]
