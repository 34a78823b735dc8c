"""The operator's side of the warm channel (docs/design.md#warm-channel): one long poll per live warm
pod keeps what its supervisor last said, for the planner (`ObservedWarm`), and enqueues the pod's
run when that changes; the planner's `WarmCommand`s are sent from here. Wiring, not rules: when a
silence fails an attempt, or what to start, is the planner's (planner/warm.py).

The run's key is read from its Secret (made here, with a new random key, before the run's first
warm Job, `ensure_key`) and kept in memory; a restarted operator reads it again."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import aiohttp

from agentrun_operator import naming
from agentrun_operator.planner.actions import WarmCommand
from agentrun_operator.planner.observed import ObservedPod, ObservedWarm, WarmResult
from agentrun_operator.shell.kube import Kube, KubeError
from agentrun_operator.shell.observe import parse_time
from agentrun_operator.shell.warm_client import WarmClient, WarmError, WarmState
from agentrun_operator.shell.workqueue import FRONT, TURNAROUND, Key

log = logging.getLogger("agentrun.warm")

POLL_WAIT_SECONDS: Final = 25.0
"""How long one long poll waits for news before it asks again (the supervisor answers at once when
there is some)."""
RETRY_SECONDS: Final = 1.0
"""The wait before asking again after a failed request (doubling while they fail)."""
MAX_RETRY_SECONDS: Final = 8.0
KEY_BYTES: Final = 32
UNREADABLE_EXIT: Final = -1
"""An iteration whose exit code the supervisor could not read: a failed attempt, never a success."""


def _result_key(heard: ObservedWarm) -> tuple[str, int] | None:
    return (heard.result.id, heard.result.exit_code) if heard.result is not None else None


def observed_of(pod: str, state: WarmState) -> ObservedWarm:
    """What the planner reads of a supervisor's answer."""
    result = state.result
    return ObservedWarm(
        pod=pod,
        phase=state.phase,
        running=state.running.id if state.running is not None else None,
        result=(
            WarmResult(
                result.id,
                UNREADABLE_EXIT if result.exit_code is None else result.exit_code,
                result.envelope,
                parse_time(result.finished_at),
                result.acked,
            )
            if result is not None
            else None
        ),
    )


@dataclass
class _Channel:
    """One live warm pod: where it listens, the last thing heard, and its long poll."""

    key: Key
    namespace: str
    pod: str
    ip: str
    secret: str
    heard: ObservedWarm
    version: int | None = None
    failures: int = 0
    task: asyncio.Task[None] | None = None
    commands: set[asyncio.Task[None]] = field(default_factory=set)


class WarmChannels:
    """Every live warm pod of the runs this operator serves, by (namespace, pod name)."""

    def __init__(self, kube: Kube, port: int, enqueue: Callable[[Key, int], None]) -> None:
        self.kube = kube
        self.port = port
        self.enqueue = enqueue
        self._keys: dict[tuple[str, str], bytes] = {}
        self._channels: dict[tuple[str, str], _Channel] = {}
        self._by_run: dict[Key, set[str]] = {}
        self._session: aiohttp.ClientSession | None = None

    def _client(self, channel: _Channel) -> WarmClient:
        if self._session is None or self._session.closed:
            # One connection per warm pod, however many: the long polls hold theirs open.
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return WarmClient(
            self._session, channel.ip, self.port, self._keys[(channel.namespace, channel.secret)]
        )

    async def close(self) -> None:
        for channel in list(self._channels.values()):
            self._drop(channel)
        if self._session is not None:
            await self._session.close()

    # -- the run's key -----------------------------------------------------------------------------

    async def ensure_key(self, namespace: str, secret: str, owner: dict[str, Any]) -> None:
        """The run's warm key exists (made with a new random key, or adopted) and is known here."""
        if (namespace, secret) in self._keys:
            return
        value = secrets.token_hex(KEY_BYTES)
        manifest = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": secret,
                "namespace": namespace,
                "labels": {naming.LABEL_MANAGED_BY: naming.MANAGED_BY},
                "ownerReferences": [owner],
            },
            "type": "Opaque",
            "data": {"key": base64.b64encode(value.encode()).decode()},
        }
        if await self.kube.create_secret(manifest):
            self._keys[(namespace, secret)] = value.encode()
            return
        await self._read_key(namespace, secret)

    async def _read_key(self, namespace: str, secret: str) -> bool:
        """The key from the run's Secret; False when there is none (yet)."""
        if (namespace, secret) in self._keys:
            return True
        data = await self.kube.get_secret_data(namespace, secret)
        raw = (data or {}).get("key")
        if not raw:
            return False
        self._keys[(namespace, secret)] = base64.b64decode(raw).strip()
        return True

    # -- what the planner reads ----------------------------------------------------------------------

    async def observe(self, key: Key, secret: str, pods: tuple[ObservedPod, ...]) -> dict[str, ObservedWarm]:
        """What each live warm pod of the run last said; starts a long poll for a pod seen with its
        IP for the first time and ends those of pods that are gone or stopped."""
        namespace = key[0]
        live = {p.name: p for p in pods if p.warm_ip and not p.terminal and not p.deleting}
        for name in list(self._by_run.get(key, ())):
            if name not in live:
                self._drop(self._channels[(namespace, name)])
        found: dict[str, ObservedWarm] = {}
        for name, pod in live.items():
            channel = self._channels.get((namespace, name))
            if channel is None or channel.ip != pod.warm_ip:
                try:
                    if not await self._read_key(namespace, secret):
                        continue
                except KubeError as exc:
                    log.warning("cannot read the run's warm key", extra={"pod": name, "error": str(exc)})
                    continue
                if channel is not None:
                    self._drop(channel)
                assert pod.warm_ip is not None
                channel = _Channel(key, namespace, name, pod.warm_ip, secret, ObservedWarm(pod=name))
                self._channels[(namespace, name)] = channel
                self._by_run.setdefault(key, set()).add(name)
                channel.task = asyncio.create_task(self._poll(channel), name=f"warm {namespace}/{name}")
                log.info("warm channel opened", extra={"pod": name, "ip": pod.warm_ip, "port": self.port})
            found[name] = channel.heard
        return found

    def forget(self, key: Key) -> None:
        """The run is gone or finished: no more polls for its pods."""
        for name in list(self._by_run.get(key, ())):
            self._drop(self._channels[(key[0], name)])

    def _drop(self, channel: _Channel) -> None:
        self._channels.pop((channel.namespace, channel.pod), None)
        names = self._by_run.get(channel.key)
        if names is not None:
            names.discard(channel.pod)
            if not names:
                del self._by_run[channel.key]
        if channel.task is not None:
            channel.task.cancel()

    # -- the long poll -------------------------------------------------------------------------------

    async def _poll(self, channel: _Channel) -> None:
        while True:
            try:
                state = await self._client(channel).state(POLL_WAIT_SECONDS, channel.version)
            except asyncio.CancelledError:
                raise
            except WarmError as exc:
                self._failed(channel, str(exc))
                await asyncio.sleep(self._backoff(channel))
                continue
            except Exception as exc:  # never a dead poll: say it, and ask again
                log.exception("warm poll failed", extra={"pod": channel.pod})
                self._failed(channel, f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(self._backoff(channel))
                continue
            self._heard(channel, state)

    def _heard(self, channel: _Channel, state: WarmState) -> None:
        channel.version = state.version
        channel.failures = 0
        heard = observed_of(channel.pod, state)
        if heard == channel.heard:
            return
        log.debug(
            "warm pod says",
            extra={
                "pod": channel.pod,
                "phase": heard.phase,
                "running": heard.running,
                "version": state.version,
            },
        )
        before = channel.heard
        channel.heard = heard
        # What the planner acts on: the pod's first word, the end of a silence, a new result. Its
        # running an iteration it was told to, or the result being acknowledged, changes no plan.
        if before.phase is None or before.error is not None:
            self.enqueue(channel.key, FRONT)
        elif _result_key(heard) != _result_key(before):
            self.enqueue(channel.key, TURNAROUND)

    @staticmethod
    def _backoff(channel: _Channel) -> float:
        """1 s after a failed request, doubling to `MAX_RETRY_SECONDS`: a pod that is gone (its IP
        maybe another pod's by now, which refuses the run's signature) is not asked every second
        until the run's next reconcile drops its channel."""
        channel.failures += 1
        return float(min(RETRY_SECONDS * 2 ** (channel.failures - 1), MAX_RETRY_SECONDS))

    def _failed(self, channel: _Channel, error: str) -> None:
        first = channel.heard.error is None
        since = datetime.now(UTC) if first else channel.heard.error_since
        channel.heard = ObservedWarm(
            pod=channel.pod,
            phase=channel.heard.phase,
            running=channel.heard.running,
            result=channel.heard.result,
            error=error,
            error_since=since,
        )
        if first:
            log.warning("warm pod does not answer", extra={"pod": channel.pod, "error": error})
            self.enqueue(channel.key, FRONT)

    # -- the planner's commands ----------------------------------------------------------------------

    async def send(self, key: Key, command: WarmCommand) -> None:
        """Send one command and take its answer as the pod's newest state; a failure is heard as any
        failed request (the planner sends the command again when it still applies)."""
        channel = self._channels.get((key[0], command.pod))
        if channel is None or channel.ip != command.ip:
            self.enqueue(key, FRONT)  # not polled yet: the next plan sends it again
            return
        client = self._client(channel)
        try:
            if command.verb == "start":
                state = await client.start(command.id, dict(command.env))
            elif command.verb == "ack":
                state = await client.ack(command.id)
            else:
                state = await client.stop(command.id)
        except WarmError as exc:
            log.warning(
                "warm command failed",
                extra={"pod": command.pod, "verb": command.verb, "id": command.id, "error": str(exc)},
            )
            if not str(exc).startswith("refused"):
                self._failed(channel, str(exc))
            return
        with contextlib.suppress(Exception):
            self._heard(channel, state)
