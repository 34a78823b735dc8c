"""Hot standby with kopf's own peering: the work queue pauses when kopf pauses (docs/operations.md#ha).

kopf decides which replica serves: every replica writes its identity, priority and a keep-alive
into the peering object named for this operator (`--peering-name`, the chart's `peering.name`), and
kopf pauses a replica that sees a live peer of higher or equal priority. Its peering is mandatory
here, so a replica starts paused and serves only after kopf has read the peering object and found
no such peer; an entry kopf cannot parse makes kopf's own decision fail, which changes nothing (a
standby stays a standby). kopf pauses its own watches (the AgentRuns' handlers, shell/handlers.py);
the operator's Job and Pod informers and its work queue are its own, so they must pause with it.

kopf has no public query of its pause state. Each peering object's decision is a toggle inside kopf,
and kopf logs every change of one, exactly once, on its peering logger: "Pausing ..." when it turns
on, "Resuming ..." when it turns off. `KopfPause` counts them: every toggle starts on (mandatory
peering), there is one per peering object (one cluster-wide, else one per watched namespace), and
this replica serves while none is on. A kopf release that words them otherwise keeps every replica
paused (fails closed); tests/unit/shell/test_peering.py drives kopf's own decision function, so such
a release fails the tests first.
"""

from __future__ import annotations

import asyncio
import logging
import random

from agentrun_operator.shell import metrics

log = logging.getLogger("agentrun.peering")

KOPF_PEERING_LOGGER = "kopf._core.engines.peering"
PAUSING = ("Pausing operations in favour of", "Pausing all operators, including self")
RESUMING = "Resuming operations after the pause"
DEFAULT_PEERING_NAME = "agentrun-operator"
"""Not kopf's `default`: a peering object shared with another kopf operator makes it a peer."""


def choose_priority(rng: random.Random | None = None) -> int:
    """A random priority per replica: kopf pauses every replica that sees an equal one, so that no
    two tie; the highest serves, the others stand by."""
    return (rng or random.Random()).randint(1, 2**30)


class KopfPause(logging.Handler):
    """`serving` is set while kopf's peering lets this replica serve, cleared while it pauses it."""

    def __init__(self, peering_objects: int) -> None:
        super().__init__(level=logging.INFO)
        self.paused = max(peering_objects, 1)  # kopf's mandatory peering starts every one paused
        self.serving = asyncio.Event()
        metrics.SERVING.set(0)

    def install(self) -> None:
        kopf_log = logging.getLogger(KOPF_PEERING_LOGGER)
        if kopf_log.getEffectiveLevel() > logging.INFO:
            kopf_log.setLevel(logging.INFO)  # the decisions are INFO and WARNING
        kopf_log.addHandler(self)
        log.info("standing by: kopf's peering decides whether this replica serves")

    def uninstall(self) -> None:
        logging.getLogger(KOPF_PEERING_LOGGER).removeHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(PAUSING):
            self.paused += 1
        elif message.startswith(RESUMING):
            self.paused = max(self.paused - 1, 0)
        else:
            return
        serve = self.paused == 0
        if serve == self.serving.is_set():
            return
        metrics.SERVING.set(1 if serve else 0)
        if serve:
            log.info("serving: kopf's peering resumed this replica")
            self.serving.set()
        else:
            log.info("standing by: kopf's peering paused this replica", extra={"paused": self.paused})
            self.serving.clear()
