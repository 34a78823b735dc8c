"""The warm supervisor: the reporter of a warm pod, which hands `main`'s shell loop one iteration at a
time and keeps each one's result until the operator has it (docs/design.md#warm-iterations).

The reporter does its usual work before `main` (control/reporter.py `cmd_warm`: the claim, the
fingerprint, the gate), then this module runs the iterations: the Job's own first, at once, and each
one the operator starts over the channel (control/warm_server.py) after it. It talks to the loop
(jobs/warm.py `WARM_LOOP_SCRIPT`) through the warm directory: the FIFO `next` takes an id (or
`stop`), `<id>/env` holds that iteration's variables, `<id>/exit` its command's exit code. Once the
exit code is there it reads the control file exactly as a cold reporter does (`Reports`).

Unlike a cold reporter it does not watch /proc (`main` is the loop, which writes the exit codes), so
it may run threads: the channel answers each connection in a thread of its own. The main thread
polls the exit file and takes SIGTERM/SIGINT, held pending (control/reporter.py `block_wait_signals`).
Standard library only, like the reporter.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, Protocol

from agentrun_operator.control.envelope import ControlEnvelope, attach_warm, encode_envelope

FIFO_NAME: Final = "next"
DEFAULT_PORT: Final = 8471
STOP_WORD: Final = "stop"
POD_IP_ENV: Final = "AGENTRUN_POD_IP"
"""The pod's IP (the downward API's `status.podIP`): the only address the channel listens on."""
LAST_ANSWERS_SECONDS: Final = 2.0
"""How long an ending supervisor waits for the answers under way (a stop's own, long polls')."""
FIFO_WRITE_SECONDS: Final = 5.0
"""How long a start or stop waits for `main` to read its FIFO before answering 503."""
EXIT_POLL: Final = 0.01
EXIT_POLL_LATER: Final = 0.1
EXIT_FAST_SECONDS: Final = 10.0
"""Looks for an iteration's exit code every 10 ms for its first 10 s, then every 100 ms; between
iterations every 10 ms while a result waits for the operator (its start of the next one comes within
milliseconds) for up to 10 s, then every 100 ms (`Supervisor.poll_seconds`)."""
ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
"""An iteration id: a directory name and a line of the FIFO (no `/`, no leading dot, not `stop`)."""
ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SIGNALS: Final = frozenset({signal.SIGTERM, signal.SIGINT})
QUOTE: Final = "'"
ESCAPED_QUOTE: Final = "'\\''"

Phase = Literal["running", "idle", "stopping"]


def log(message: str) -> None:
    """One line to stderr (kubectl logs -c reporter), written whole: threads log too."""
    with contextlib.suppress(Exception):
        sys.stderr.write(f"agentrun reporter: warm: {message}\n")
        sys.stderr.flush()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Reports(Protocol):
    """How the reporter reads an iteration's control file (control/reporter.py `IterationReports`)."""

    def fingerprint_again(self) -> None:
        """Record the control file as it is before an iteration, so one left by the last reads stale."""

    def report(self, first: bool) -> ControlEnvelope:
        """The envelope of the iteration that just ended, exactly as a cold reporter's; the claim's
        outcome only in the pod's first."""


class Refusal(Exception):
    """A request the supervisor refuses: its status code and why (`{"error": ...}`)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# --------------------------------------------------------------------- the requests' rules (pure)
# What a start, an ack and a stop do in each state (docs/design.md#warm-channel), apart from their
# effects: the supervisor applies them, and so does the KWOK plane's simulated one
# (tests/bench/warm_sim.py). `running`: the id running, if any; `held`: the id of the result held,
# if any, and whether it is acknowledged; `acknowledged`: every id acknowledged in this pod.


def start_runs(
    phase: str,
    running: str | None,
    held: str | None,
    held_acked: bool,
    acknowledged: Container[str],
    iteration: str,
) -> bool:
    """Whether a start of `iteration` runs it: False when it runs, or its result is held and not
    acknowledged (the same start again, a no-op); a Refusal (409) when another runs, the pod is
    stopping, or `iteration` ran here and was acknowledged."""
    if running == iteration or (held == iteration and not held_acked):
        return False
    if phase == "stopping":
        raise Refusal(409, f"the pod is stopping: iteration {iteration} not started")
    if running is not None:
        raise Refusal(409, f"iteration {running} is running: iteration {iteration} not started")
    if iteration in acknowledged:
        raise Refusal(409, f"iteration {iteration} ran in this pod and was acknowledged")
    return True


def ack_takes(
    running: str | None, held: str | None, held_acked: bool, acknowledged: Container[str], iteration: str
) -> bool:
    """Whether an ack of `iteration` acknowledges the result held: False when it was acknowledged
    before (a no-op); a Refusal when it runs (409) or this pod holds no result of it (404)."""
    if running == iteration:
        raise Refusal(409, f"iteration {iteration} is running: no result to acknowledge")
    if held == iteration and not held_acked:
        return True
    if iteration not in acknowledged:
        raise Refusal(404, f"no result of iteration {iteration} in this pod")
    return False


def stop_ends(
    phase: str,
    running: str | None,
    held: str | None,
    held_acked: bool,
    acknowledged: Container[str],
    iteration: str,
) -> bool:
    """Whether a stop after `iteration` ends the pod: False while it is stopping already (a no-op); a
    Refusal while an iteration runs (409), for an id this pod never finished (404), or while the
    result held is another id's, not acknowledged (409)."""
    if phase == "stopping":
        return False
    if running is not None:
        raise Refusal(409, f"iteration {running} is running: not stopping")
    if held != iteration and iteration not in acknowledged:
        raise Refusal(404, f"no result of iteration {iteration} in this pod")
    if held is not None and held != iteration and not held_acked:
        raise Refusal(409, f"iteration {held}'s result is not acknowledged: not stopping")
    return True


# ------------------------------------------------------------------------------ the warm directory


def read_key(path: str) -> bytes:
    """The run's key: the file's bytes, exactly (the Secret's value)."""
    try:
        with open(path, "rb") as handle:
            key = handle.read()
    except OSError as exc:
        raise Refusal(500, f"cannot read the run's key {path}: {exc.strerror or exc}") from None
    if not key:
        raise Refusal(500, f"the run's key {path} is empty")
    return key


def make_channel(directory: str) -> str:
    """The warm directory and its FIFO (made before the ready file: `main` opens it at its start);
    the FIFO's path. Readable by `main`, whichever uid it runs as."""
    os.makedirs(directory, exist_ok=True)
    fifo = os.path.join(directory, FIFO_NAME)
    with contextlib.suppress(FileExistsError):
        os.mkfifo(fifo, 0o644)
    if not stat.S_ISFIFO(os.lstat(fifo).st_mode):
        raise OSError(errno.EEXIST, f"{fifo} exists and is not a FIFO")
    os.chmod(fifo, 0o644)
    return fifo


def env_text(env: Mapping[str, str]) -> str:
    """`export NAME='value'` lines, for the loop to source: single quotes keep every byte but `'`,
    written `'\\''`."""
    return "".join(f"export {name}='{value.replace(QUOTE, ESCAPED_QUOTE)}'\n" for name, value in env.items())


def write_iteration(directory: str, iteration: str, env: Mapping[str, str]) -> None:
    """`<id>/env`, atomically; the id's directory writable by `main` (its exit code goes there)."""
    where = os.path.join(directory, iteration)
    with contextlib.suppress(FileExistsError):
        os.mkdir(where)
    os.chmod(where, 0o777)
    tmp = os.path.join(where, ".env.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(env_text(env))
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(where, "env"))


def read_exit(directory: str, iteration: str) -> tuple[bool, int | None]:
    """(whether the iteration has ended, its command's exit code: None when unreadable)."""
    try:
        with open(os.path.join(directory, iteration, "exit"), encoding="ascii", errors="replace") as handle:
            text = handle.read().strip()
    except FileNotFoundError:
        return False, None
    except OSError:
        return True, None
    return True, int(text) if text.isdigit() else None


def write_fifo(fifo: str, word: str, give_up: Callable[[], bool]) -> bool:
    """Hand `word` to `main`, which reads its FIFO between iterations. A write end opened without
    blocking fails with ENXIO until `main` opens the FIFO: tried again until `give_up()` (it also
    waits between tries). One line of at most `PIPE_BUF` bytes: written whole or not at all."""
    data = f"{word}\n".encode()
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
        else:
            try:
                os.write(fd, data)
                return True
            except BrokenPipeError:  # `main` stopped reading between the open and the write
                pass
            finally:
                os.close(fd)
        if give_up():
            return False


def _bounded(seconds: float) -> Callable[[], bool]:
    deadline = time.monotonic() + seconds

    def give_up() -> bool:
        if time.monotonic() >= deadline:
            return True
        time.sleep(EXIT_POLL)
        return False

    return give_up


# ------------------------------------------------------------------------------------ the state


@dataclass
class Running:
    id: str
    started_at: str | None
    """None until `main` has taken the id (the pod's first iteration, while its gate opens)."""
    since: float = 0.0


@dataclass
class Result:
    id: str
    exit_code: int | None
    envelope: ControlEnvelope
    text: str
    finished_at: str
    acked: bool = False
    since: float = 0.0
    """When the supervisor saw it end (monotonic)."""


@dataclass(frozen=True)
class Settings:
    directory: str
    first_id: str
    idle_seconds: float
    path: str
    """The control path (for the envelope of a pod that finished no iteration)."""


class Supervisor:
    """The iterations of one warm pod and the state the channel serves. The state lock is held only
    for quick changes; `_handing` keeps FIFO writes (starts, stops) one at a time."""

    def __init__(self, settings: Settings, reports: Reports) -> None:
        self.settings = settings
        self.reports = reports
        self.fifo = os.path.join(settings.directory, FIFO_NAME)
        self._changed = threading.Condition()
        self._handing = threading.Lock()
        self.version = 1
        self.phase: Phase = "running"
        self.running: Running | None = Running(settings.first_id, None)
        self.result: Result | None = None
        self.acknowledged: set[str] = set()
        self.acked_at: float | None = None
        self.ending: str | None = None
        """Why the supervisor ends (`stop`, `idle`, a signal): its main loop returns."""
        self.closing = False

    # ------------------------------------------------------------------------------------ reading

    def state(self) -> dict[str, Any]:
        with self._changed:
            return self._state()

    def _state(self) -> dict[str, Any]:
        running = self.running
        result = self.result
        return {
            "v": 1,
            "version": self.version,
            "phase": self.phase,
            "running": None if running is None else {"id": running.id, "startedAt": running.started_at},
            "result": None
            if result is None
            else {
                "id": result.id,
                "exitCode": result.exit_code,
                "envelope": result.text,
                "finishedAt": result.finished_at,
                "acked": result.acked,
            },
        }

    def wait_for_change(self, seen: int | None, wait: float) -> dict[str, Any]:
        """The state once its version is not `seen` (at once when it is not already), or after `wait`
        seconds; at once too when the supervisor is closing."""
        with self._changed:
            if seen is not None:
                self._changed.wait_for(lambda: self.version != seen or self.closing, timeout=wait)
            return self._state()

    def _changed_now(self) -> None:
        self.version += 1
        self._changed.notify_all()

    # ----------------------------------------------------------------------------------- requests

    def start(self, iteration: str, env: Mapping[str, str]) -> dict[str, Any]:
        """Start `iteration` (acknowledging the result held); the same id again is a no-op."""
        with self._handing:
            with self._changed:
                if not start_runs(self.phase, *self._ids(), self.acknowledged, iteration):
                    return self._state()
            self.reports.fingerprint_again()
            write_iteration(self.settings.directory, iteration, env)
            if not write_fifo(self.fifo, iteration, _bounded(FIFO_WRITE_SECONDS)):
                raise Refusal(503, f"main is not reading its FIFO {self.fifo}: {iteration} not started")
            with self._changed:
                held = self.result
                if held is not None and not held.acked:
                    held.acked = True
                    self.acknowledged.add(held.id)
                self.running = Running(iteration, _now(), time.monotonic())
                self.phase = "running"
                self._changed_now()
            log(f"started iteration {iteration}")
            if held is not None:
                self._forget(held.id)
            return self.state()

    def _ids(self) -> tuple[str | None, str | None, bool]:
        """(the id running, the id of the result held, whether that is acknowledged): what the
        requests' rules read (`start_runs`, `ack_takes`, `stop_ends`); under the state lock."""
        result = self.result
        running = self.running.id if self.running is not None else None
        return running, (result.id if result is not None else None), (result is not None and result.acked)

    def ack(self, iteration: str) -> dict[str, Any]:
        """Record that the operator has the result of `iteration`: the idle clock starts."""
        with self._changed:
            result = self.result
            if ack_takes(*self._ids(), self.acknowledged, iteration) and result is not None:
                result.acked = True
                self.acknowledged.add(iteration)
                self.acked_at = time.monotonic()
                self._changed_now()
                log(f"iteration {iteration} acknowledged")
            return self._state()

    def stop(self, iteration: str) -> dict[str, Any]:
        """Acknowledge `iteration` and end `main`'s loop; the supervisor then ends too."""
        with self._handing:
            with self._changed:
                if not stop_ends(self.phase, *self._ids(), self.acknowledged, iteration):
                    return self._state()
                result = self.result
            if not write_fifo(self.fifo, STOP_WORD, _bounded(FIFO_WRITE_SECONDS)):
                raise Refusal(503, f"main is not reading its FIFO {self.fifo}: not stopped")
            with self._changed:
                if result is not None and result.id == iteration:
                    result.acked = True
                self.acknowledged.add(iteration)
                self.phase = "stopping"
                self.ending = "stop"
                self._changed_now()
            log(f"stopped after iteration {iteration}")
            return self.state()

    # ---------------------------------------------------------------------------- the main thread

    def hand_first(self, signalled: Callable[[float], bool]) -> bool:
        """Hand the pod's first iteration to `main` once it reads its FIFO (its gate is open, but its
        image may still be pulled: no bound); False when a signal came first."""
        first = self.settings.first_id
        write_iteration(self.settings.directory, first, {})
        since = time.monotonic()

        def give_up() -> bool:
            fast = time.monotonic() - since < EXIT_FAST_SECONDS
            return signalled(EXIT_POLL if fast else EXIT_POLL_LATER)

        with self._handing:
            if not write_fifo(self.fifo, first, give_up):
                return False
            with self._changed:
                self.running = Running(first, _now(), time.monotonic())
                self._changed_now()
        log(f"started iteration {first} (the pod's first)")
        return True

    def run(self, signalled: Callable[[float], bool]) -> str:
        """Until the supervisor ends: why (`stop`, `idle`, `signal`). `signalled(timeout)` sleeps and
        says whether SIGTERM/SIGINT came meanwhile."""
        while True:
            with self._changed:
                running, ending = self.running, self.ending
                wait = self.poll_seconds(time.monotonic())
            if ending is not None:
                return ending
            if signalled(wait):
                return "signal"
            if running is not None:
                self._finish_if_ended(running)
            elif self._idle_over():
                self._stop_idle()

    def poll_seconds(self, now: float) -> float:
        """How long the main thread waits before it looks again (under the state lock): `EXIT_POLL`
        for a running iteration's first `EXIT_FAST_SECONDS`, and between iterations for as long while
        the last result waits for the operator, whose start of the next iteration usually follows it
        within milliseconds (so that iteration's end is not seen up to `EXIT_POLL_LATER` late when it
        is short); `EXIT_POLL_LATER` otherwise: a long iteration, an acknowledged result (idle)."""
        running, result = self.running, self.result
        if running is not None:
            fast = now - running.since < EXIT_FAST_SECONDS
        else:
            fast = result is not None and not result.acked and now - result.since < EXIT_FAST_SECONDS
        return EXIT_POLL if fast else EXIT_POLL_LATER

    def _finish_if_ended(self, running: Running) -> None:
        ended, code = read_exit(self.settings.directory, running.id)
        if not ended:
            return
        envelope = self.reports.report(first=running.id == self.settings.first_id)
        result = Result(running.id, code, envelope, encode_envelope(envelope), _now(), since=time.monotonic())
        with self._changed:
            self.result = result
            self.running = None
            self.phase = "idle"
            self._changed_now()
        log(f"iteration {running.id} ended: exit code {code}, control file {envelope.status}")

    def _idle_over(self) -> bool:
        with self._changed:
            return (
                self.result is not None
                and self.result.acked
                and self.acked_at is not None
                and time.monotonic() - self.acked_at >= self.settings.idle_seconds
            )

    def _stop_idle(self) -> None:
        """No work since the last acknowledgement: end `main`'s loop. Not while a start is being
        handed over (it holds `_handing`: tried again at the next poll)."""
        if not self._handing.acquire(blocking=False):
            return
        try:
            if not self._idle_over() or self.running is not None:
                return
            with self._changed:
                self.phase = "stopping"
                self._changed_now()
            if not write_fifo(self.fifo, STOP_WORD, _bounded(FIFO_WRITE_SECONDS)):
                log(f"main did not read its FIFO {self.fifo}: it is not told to stop")
            with self._changed:
                self.ending = "idle"
            log(f"idle for {self.settings.idle_seconds:g}s after the last acknowledgement: stopped")
        finally:
            self._handing.release()

    def close(self) -> None:
        """The supervisor ends: pending long polls answer at once, saying so. (At a signal `main` is
        not told: the kubelet sends it SIGTERM too, which ends its loop.)"""
        with self._changed:
            self.phase = "stopping"
            self.closing = True
            self._changed_now()

    def _forget(self, iteration: str) -> None:
        """An acknowledged iteration's files are of no more use."""
        shutil.rmtree(os.path.join(self.settings.directory, iteration), ignore_errors=True)

    def termination_text(self) -> str:
        """The termination message: the last finished iteration's envelope with `warm` (its id and
        exit code); without one, `missing` saying no iteration finished."""
        with self._changed:
            result, running = self.result, self.running
        # The iteration handed to `main` and not finished: the operator must not take it for one that
        # never started (planner/warm.py `_never_started`).
        started = {"running": running.id} if running is not None and running.started_at is not None else {}
        if result is None:
            missing = ControlEnvelope(
                status="missing",
                path=self.settings.path,
                reason="no warm iteration finished in this pod",
            )
            return encode_envelope(attach_warm(missing, started) if started else missing)
        warm = {"id": result.id, "exitCode": result.exit_code, **started}
        return encode_envelope(attach_warm(result.envelope, warm))


def valid_id(value: Any) -> str:
    """An iteration id from a request; 400 otherwise."""
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value) or value == STOP_WORD:
        raise Refusal(400, f"id must be a string matching {ID_PATTERN.pattern} (not {STOP_WORD!r})")
    return value


def valid_env(value: Any) -> dict[str, str]:
    """An iteration's variables from a request: names of the shell, string values without NUL."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Refusal(400, "env must be an object of names to strings")
    for name, text in value.items():
        if not ENV_NAME.fullmatch(name):
            raise Refusal(400, f"env: {name[:64]!r} is not a variable name")
        if not isinstance(text, str) or "\0" in text:
            raise Refusal(400, f"env: {name} must be a string without NUL")
    return dict(value)


def signalled(timeout: float) -> bool:
    """Sleep up to `timeout` seconds, or less when SIGTERM/SIGINT (held pending) arrives: True then."""
    return signal.sigtimedwait(_SIGNALS, timeout) is not None
