"""What only a real node can show, taken over by test_real_node.py (this file is not a test module
of its own: the pod runner ignores images, so nothing here could run on it).

An iteration pod whose image is not on the node stays `Pending` with `ErrImageNeverPull` (or
`ErrImagePull`): the step's message names the container and the image within seconds, one Warning
Event says it, and the step's timeout still ends the run (docs/design.md#pod-waits).
"""

from __future__ import annotations

import json

from tests.e2e.conftest import LocalDefault, step_status
from tests.support.polling import eventually

IMAGE_REASONS = ("ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff")


def test_a_missing_image_is_named_in_the_step_message_and_the_timeout_ends_the_run(
    local_default: LocalDefault,
) -> None:
    def missing_image(text: str) -> str:
        return (
            text.replace("name: timeout\n", "name: missing-image\n")
            .replace("image: busybox:1.36", "image: busybox:does-not-exist")
            .replace("retries: 1", "retries: 0")
            .replace("timeout-workspace", "missing-image-workspace")
        )

    local_default.apply_example("timeout.yaml", edit=missing_image)

    def waiting() -> str | None:
        steps = ((local_default.run("missing-image").get("status") or {}).get("workflow") or {}).get("steps")
        message = str((steps or [{}])[0].get("message") or "")
        return message if ": waiting, " in message else None

    message = eventually(waiting, timeout=60, what="the step message to say why the pod waits")
    assert "container main of pod" in message, message
    assert "image busybox:does-not-exist" in message, message
    assert any(reason in message for reason in IMAGE_REASONS), message

    run = local_default.wait_for_end("missing-image")
    assert run["status"]["phase"] == "Failed", run["status"]
    step = step_status(run)
    assert step["loop"]["stopReason"] == "LoopIterationFailed"
    ended = step["message"]
    assert "timed out after 10s (activeDeadlineSeconds); its pod never started" in ended, ended
    assert "busybox:does-not-exist" in ended, ended

    events = json.loads(
        local_default.plane.kubectl(
            "get",
            "events",
            "-n",
            local_default.namespace,
            "--field-selector",
            "reason=IterationWaiting",
            "-o",
            "json",
        )
    )["items"]
    about = [e for e in events if e["involvedObject"]["name"] == "missing-image"]
    assert len(about) == 1, [e["message"] for e in about]
    assert "busybox:does-not-exist" in about[0]["message"]
