"""`agentrun reporter`: the small program in every iteration pod that carries the control payload out.

The operator never mounts the PVC, so the pod reports for it (docs/design.md#iteration-pod). One
container of the operator image runs this module: ``report``, a regular container listed before
``main`` that lives as long as ``main`` does (docs/design.md#reporter-first).

1. Before ``main`` (``--before-main``): it blocks SIGTERM first thing, claims the Job for its pod
   (``claim``), records what the control file looks like (the fingerprint), and writes its pid
   to ``--ready-file`` — or ``taken`` when another pod of the Job holds the claim. The reporter's
   postStart hook, a shell loop, waits for that file; the kubelet starts ``main`` only once the hook
   has completed. The hook opens ``main``'s gate for a pid and keeps it shut otherwise, so ``main``
   never starts before the claim and the fingerprint, and never in a duplicate pod.
2. After ``main`` (``--hook-done``): it watches the pod's shared PID namespace until ``main``'s
   processes have ended (control/mainwatch.py), or until SIGTERM (the pod's deletion), then reads
   the control file, compares it with the fingerprint (a file with the same fingerprint was left by
   an earlier iteration: ``stale``, which counts as missing), writes the control envelope to its
   termination message, with the claim's outcome when that is news, and exits.
3. A best-of-N candidate pod (``--candidate-*``, loop.candidates) claims per index of its Indexed
   Job, copies the iteration's start into its own work tree before ``main``, and records that tree
   as its own checkpoint once ``main`` has ended, before the report (control/checkpointing.py).
4. A warm pod's reporter (``--warm``, loop.warm) does the same before ``main``, then supervises
   ``main``'s loop of iterations and serves the operator's channel (`cmd_warm`, control/warm.py);
   each iteration's envelope is read here, as a cold one's is.

``--wait-for-signal`` is the native sidecar of pods made before (it reported at the SIGTERM the
kubelet sends a sidecar once ``main`` has ended); ``fingerprint`` is the init container of pods
older still. Both stay for Jobs made by earlier builds until the release after 0.1.0 removes them
(docs/operations.md#earlier-pods).

The report never fails the pod: problems are recorded (exit 0), and it is always a well-formed
envelope. One exception, before ``main`` may start: a reporter that cannot see the pod's
processes (no shared PID namespace, control/mainwatch.py `blind_reason`) would wait for good, so it
writes why to its termination message, keeps ``main``'s gate shut (its ready file says ``blind``)
and exits ``BLIND_EXIT``; the operator fails the attempt at once with that message.

The reporter imports the standard library only, `envelope` included: it runs in every iteration
pod, and its start and its end sit on the iteration's critical path (docs/design.md#reporter-first).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import stat
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from agentrun_operator.control.checkpointing import (
    CHECKPOINT_EXIT,
    REFUSED,
    CheckpointArgs,
    CheckpointRefusal,
    load_facts,
    parse_candidate,
    prepare_workspace,
    record_candidate,
    save_facts,
)
from agentrun_operator.control.envelope import (
    MAX_CONTROL_FILE_BYTES,
    MAX_ENVELOPE_BYTES,
    ControlEnvelope,
    attach_checkpoint,
    attach_extras,
    encode_envelope,
    fit_envelope,
    parse_control_payload,
)
from agentrun_operator.control.gate import GateFiles

FINGERPRINT_VERSION: Final = 1
READ_LIMIT: Final = MAX_CONTROL_FILE_BYTES
"""The most of the control file the reporter reads (+1, to see that there is more)."""
DEFAULT_READY_TIMEOUT: Final = 10.0
TAKEN: Final = "taken"
BLIND: Final = "blind"
"""The ready file's word for a reporter that cannot see `main` (the hook keeps `main` shut)."""
BLIND_EXIT: Final = 3
"""The reporter's exit code when it cannot see `main` (its termination message says why)."""
"""What the ready file says in a duplicate pod, whose `main` must never run; else it holds the
reporter's pid (the pod may start `main`)."""
NO_CHANNEL: Final = "nochannel"
"""The ready file's word for a warm reporter without its key or channel (the hook keeps `main` shut)."""
WARM_EXIT: Final = 5
"""A warm reporter's exit code when it has no key or cannot open its channel (its message says why)."""
JOB_UID_ENV: Final = "AGENTRUN_JOB_UID"
POD_UID_ENV: Final = "AGENTRUN_POD_UID"
"""Set on the reporter from the downward API; read by ``report --before-main``."""
_WAIT_SIGNALS: Final = frozenset({signal.SIGTERM, signal.SIGINT})
HOOK_POLL: Final = 0.01
"""How often the reporter looks for its postStart hook's last line."""
WATCH_POLL: Final = 0.02
WATCH_POLL_LATER: Final = 0.1
WATCH_FAST_SECONDS: Final = 10.0
"""Looks at the pod's processes every 20 ms for `main`'s first 10 s, then every 100 ms."""


def _log(message: str) -> None:
    """Diagnostics go to stderr (kubectl logs); stdout carries only the envelope."""
    with contextlib.suppress(Exception):  # a closed stderr must not break reporting
        print(f"agentrun reporter: {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------- observing the file


@dataclass(frozen=True)
class Observation:
    """What is at the control path right now. ``data`` is at most ``READ_LIMIT + 1`` bytes."""

    exists: bool
    size: int | None = None
    mtime_ns: int | None = None
    sha256: str | None = None
    data: bytes | None = None
    error: str | None = None  # why an existing path could not be read as a regular file


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    remaining = limit
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 65536))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def observe(path: str, limit: int = READ_LIMIT) -> Observation:
    """Look at the control path without ever blocking (FIFOs) or reading more than ``limit + 1`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return Observation(exists=False)
    except OSError as exc:
        return Observation(exists=os.path.lexists(path), error=f"cannot open: {exc.strerror or exc}")
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            return Observation(exists=True, error="is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            return Observation(exists=True, error="is not a regular file")
        try:
            data = _read_at_most(fd, limit + 1)
        except OSError as exc:
            return Observation(exists=True, size=st.st_size, error=f"cannot read: {exc.strerror or exc}")
        return Observation(
            exists=True,
            size=max(st.st_size, len(data)),
            mtime_ns=st.st_mtime_ns,
            sha256=hashlib.sha256(data).hexdigest(),
            data=data,
        )
    except OSError as exc:  # pragma: no cover - fstat on an open fd practically never fails
        return Observation(exists=True, error=f"cannot stat: {exc.strerror or exc}")
    finally:
        os.close(fd)


def fingerprint_of(path: str, obs: Observation) -> dict[str, Any]:
    """The JSON document ``fingerprint`` records (hash of the first ``READ_LIMIT + 1`` bytes)."""
    return {
        "v": FINGERPRINT_VERSION,
        "path": path,
        "exists": obs.exists,
        "size": obs.size,
        "mtime_ns": obs.mtime_ns,
        "sha256": obs.sha256,
        "error": obs.error,
        "taken_at": time.time(),
    }


def is_stale(fingerprint: dict[str, Any], obs: Observation) -> bool:
    """True when the file is byte-for-byte and mtime-for-mtime what it was before the main container.

    Touching or rewriting the file (even with identical content) changes the mtime, so it counts as
    written by this iteration.
    """
    return (
        fingerprint.get("exists") is True
        and fingerprint.get("error") is None
        and fingerprint.get("sha256") is not None
        and obs.exists
        and obs.error is None
        and fingerprint.get("size") == obs.size
        and fingerprint.get("mtime_ns") == obs.mtime_ns
        and fingerprint.get("sha256") == obs.sha256
    )


def _write_atomically(path: str, text: str) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _wait_for_file(path: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def claim_or_wait(
    claim_dir: str,
    job_uid: str,
    pod_uid: str,
    volume: str = "",
    termination_log: str | None = None,
    fail_if_taken: bool = False,
) -> bool:
    """Claim the Job for this pod; False when another pod holds it (with ``fail_if_taken``; without,
    a pod that finds it claimed by another never returns, see `claim`).

    The outcome goes to ``termination_log`` too: the old init container's termination message, or
    the file the reporter puts in its envelope (the operator turns an unavailable claim into a
    Warning Event and a condition naming ``volume``, docs/concepts.md#exactly-once)."""
    from agentrun_operator.control import claim

    taken = claim.claim_job(claim_dir, job_uid, pod_uid)
    if taken.outcome == "claimed":
        claim.prune_claims(claim_dir, time.time())
        _log(f"claimed Job {job_uid} for this pod")
    elif taken.outcome == "ours":
        _log(f"Job {job_uid} was already claimed for this pod")
    elif taken.outcome == "unavailable":
        on = f" on volume {volume!r}" if volume else ""
        _log(f"no claim of Job {job_uid}{on}: {taken.detail}; going on (a duplicate pod would run main too)")
    if termination_log and (taken.outcome != "taken" or fail_if_taken):
        try:
            _write_atomically(termination_log, claim.report_text(taken, volume, claim_dir))
        except OSError as exc:
            _log(f"cannot write the claim's outcome to {termination_log}: {exc}")
    if taken.outcome != "taken":
        return True
    _log(
        f"Job {job_uid} already runs in pod {taken.detail}: this pod is a duplicate the Job controller "
        "created; it never runs main"
        + ("" if fail_if_taken else " (waiting until the Job controller deletes it)")
    )
    if fail_if_taken:  # the reporter: its postStart hook then fails, so main never starts
        return False
    while True:  # SIGTERM (the pod's deletion) ends the process
        time.sleep(3600)


def record_fingerprint(path: str, out: str, checkout: str | None = None) -> None:
    """Record what the control file looks like now into ``out`` (and, with ``checkout``, the commit
    the Git checkout is at); never raises."""
    try:
        doc = fingerprint_of(path, observe(path))
    except Exception as exc:  # pragma: no cover - observe() handles OS errors itself
        error = f"{type(exc).__name__}: {exc}"
        doc = {"v": FINGERPRINT_VERSION, "path": path, "exists": None, "error": error}
    if checkout:
        from agentrun_operator.control.extras import head_commit

        doc["commit"] = head_commit(checkout)
    try:
        _write_atomically(out, json.dumps(doc, separators=(",", ":")))
    except Exception as exc:
        _log(f"cannot write the fingerprint to {out}: {exc}; stale files will not be detected")
        return
    state = "absent" if doc.get("exists") is False else (doc.get("error") or f"{doc.get('size')} bytes")
    _log(f"fingerprint of {path}: {state}")


def cmd_fingerprint(
    path: str,
    out: str,
    reporter_ready: str | None,
    ready_timeout: float,
    claim_dir: str | None = None,
    job_uid: str = "",
    pod_uid: str = "",
    claim_volume: str = "",
    termination_log: str | None = None,
    checkout: str | None = None,
) -> int:
    """Claim the Job (with ``claim_dir``), then record the control file's fingerprint into ``out``
    (and, with ``checkout``, the commit the Git checkout is at before ``main``); exit 0 whatever
    happens (a duplicate pod waits in `claim_or_wait` instead). The init container of pods made
    before the reporter did this itself (`prepare_for_main`)."""
    if reporter_ready and not _wait_for_file(reporter_ready, ready_timeout):
        _log(f"the reporter did not become ready within {ready_timeout:g}s ({reporter_ready}); going on")
    if claim_dir:
        claim_or_wait(claim_dir, job_uid, pod_uid, claim_volume, termination_log)
    record_fingerprint(path, out, checkout)
    return 0


def prepare_for_main(
    path: str,
    fingerprint: str,
    claim_dir: str | None,
    claim_volume: str,
    claim_report: str | None,
    checkout: str | None = None,
    checkpoint: CheckpointArgs | None = None,
    checkpoint_facts: str | None = None,
) -> bool:
    """What must happen before `main` starts, done by the reporter itself: claim the Job for this pod
    (uids from the downward API in its environment), restore and record the workspace's checkpoint
    (loop.checkpoint, control/checkpointing.py), then fingerprint the control file. False when
    another pod holds the claim: this pod is a duplicate and must never run `main`. A reporter that
    restarts in the same pod keeps the first fingerprint (``main`` may have written the file since)
    and the first checkpoint's facts, and finds the claim its own. Raises `CheckpointRefusal` when
    the checkpoint failed (`main` must not start)."""
    if claim_dir:
        job_uid, pod_uid = os.environ.get(JOB_UID_ENV, ""), os.environ.get(POD_UID_ENV, "")
        if job_uid and checkpoint is not None and checkpoint.candidate is not None:
            # The N pods of an Indexed Job are no duplicates of each other: one claim per index.
            job_uid = f"{job_uid}-{checkpoint.candidate.index}"
        if not claim_or_wait(claim_dir, job_uid, pod_uid, claim_volume, claim_report, fail_if_taken=True):
            return False
    if checkpoint is not None and checkpoint_facts and load_facts(checkpoint_facts) is None:
        facts = prepare_workspace(checkpoint)
        _log(f"checkpoint: {json.dumps(facts, separators=(',', ':'))}")
        try:
            save_facts(checkpoint_facts, facts)
        except OSError as exc:
            _log(f"cannot keep the checkpoint's facts in {checkpoint_facts}: {exc}")
    if os.path.exists(fingerprint):
        _log(f"keeping the fingerprint taken before main started ({fingerprint})")
    else:
        record_fingerprint(path, fingerprint, checkout)
    return True


def _load_claim(claim_report: str | None) -> dict[str, Any] | None:
    """The claim report written before `main`, when it says something the operator must hear
    (`unavailable`, or `taken` by another pod); None for a claim taken as expected, or none."""
    if not claim_report:
        return None
    try:
        with open(claim_report, encoding="utf-8") as handle:
            doc = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("claim") not in ("unavailable", "taken"):
        return None
    return doc


# ------------------------------------------------------------------------------------- the report


def _load_fingerprint(fingerprint_path: str | None, path: str) -> tuple[dict[str, Any] | None, str | None]:
    """The recorded fingerprint, or None and why it cannot be used."""
    if not fingerprint_path:
        return None, "no --fingerprint given"
    try:
        with open(fingerprint_path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except FileNotFoundError:
        return None, f"no fingerprint at {fingerprint_path} (did the fingerprint init container run?)"
    except (OSError, ValueError) as exc:
        return None, f"unreadable fingerprint {fingerprint_path}: {exc}"
    if not isinstance(doc, dict) or doc.get("v") != FINGERPRINT_VERSION:
        return None, f"fingerprint {fingerprint_path} has an unknown format"
    if doc.get("path") != path:
        return None, f"fingerprint is of {doc.get('path')!r}, not {path!r}"
    return doc, None


def build_report(path: str, fingerprint_path: str | None) -> ControlEnvelope:
    """Look at the control file now and decide its envelope (found/missing/stale/invalid/tooLarge)."""
    obs = observe(path)
    fingerprint, why_not = _load_fingerprint(fingerprint_path, path)
    if not obs.exists:
        reason = f"no file at {path}"
        if fingerprint is not None and fingerprint.get("exists") is True:
            reason += " (one existed before the main container started; this iteration deleted it)"
        return ControlEnvelope(status="missing", path=path, reason=reason)
    if obs.error is not None:
        return ControlEnvelope(status="invalid", path=path, size=obs.size, reason=f"{path} {obs.error}")
    if fingerprint is not None and is_stale(fingerprint, obs):
        return ControlEnvelope(
            status="stale",
            path=path,
            size=obs.size,
            reason=(
                "control file was not rewritten by this iteration: same size, mtime and content as "
                "before the main container started (left by an earlier iteration)"
            ),
        )
    if why_not is not None:
        _log(f"staleness not checked: {why_not}")
    return parse_control_payload(obs.data or b"", path, file_size=obs.size)


def _fallback_text(path: str, reason: str) -> str:
    """An ``invalid`` envelope in plain JSON, for when even building one with the envelope module
    failed."""
    path = path.encode("utf-8", "replace").decode("utf-8")
    reason = reason.encode("utf-8", "replace").decode("utf-8") or "reporter error"
    for limit in (None, 1024, 256):
        doc = {
            "v": 1,
            "status": "invalid",
            "path": path[:limit],
            "size": None,
            "reason": reason[:limit],
            "control": None,
        }
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
        if len(text.encode("utf-8")) <= MAX_ENVELOPE_BYTES:
            return text
    return '{"v":1,"status":"invalid","path":"","size":null,"reason":"reporter error","control":null}'


def extras(
    fingerprint_path: str | None, path: str, checkout: str | None, artifacts: Sequence[str]
) -> tuple[str | None, list[dict[str, Any]] | None]:
    """(the checkout's commit when this iteration moved it, the artifacts' facts) for the envelope.

    The commit is reported when it differs from the one `fingerprint` recorded before ``main`` ran
    (or none was recorded): an iteration that committed nothing reports none."""
    from agentrun_operator.control.extras import artifact_fact, head_commit

    commit = None
    if checkout:
        commit = head_commit(checkout)
        fingerprint, _ = _load_fingerprint(fingerprint_path, path)
        if fingerprint is not None and commit is not None and fingerprint.get("commit") == commit:
            commit = None
    facts = None
    if artifacts:
        facts = [artifact_fact(*spec.split("=", 1)) for spec in artifacts if "=" in spec]
    return commit, facts


def report_text(
    path: str,
    fingerprint_path: str | None,
    claim_report: str | None = None,
    checkout: str | None = None,
    artifacts: Sequence[str] = (),
    checkpoint_facts: str | None = None,
) -> str:
    """The encoded envelope for the control file (with the claim's outcome when it is news, the
    checkpoint's facts, the commit and the artifacts); any unexpected error becomes an ``invalid`` one."""
    try:
        return encode_envelope(
            report_envelope(path, fingerprint_path, claim_report, checkout, artifacts, checkpoint_facts)
        )
    except Exception as exc:
        return _fallback_text(path, f"reporter failed: {type(exc).__name__}: {exc}")


def report_envelope(
    path: str,
    fingerprint_path: str | None,
    claim_report: str | None = None,
    checkout: str | None = None,
    artifacts: Sequence[str] = (),
    checkpoint_facts: str | None = None,
) -> ControlEnvelope:
    """`report_text`'s envelope, fitted to the termination message, before it is encoded (a warm
    pod adds the iteration to it, control/warm.py)."""
    try:
        envelope = build_report(path, fingerprint_path)
        claim = _load_claim(claim_report)
        if claim is not None:
            envelope = envelope.replace(claim=claim)
        facts = load_facts(checkpoint_facts) if checkpoint_facts else None
        if facts is not None:
            envelope = _attach_facts(envelope, facts)
        if checkout or artifacts:
            try:
                envelope = attach_extras(envelope, *extras(fingerprint_path, path, checkout, artifacts))
            except Exception as exc:  # the control report must not be lost for the extras
                _log(f"cannot report the commit or artifacts: {type(exc).__name__}: {exc}")
        return fit_envelope(envelope)
    except Exception as exc:
        _log(f"unexpected error: {type(exc).__name__}: {exc}")
        reason = f"reporter failed: {type(exc).__name__}: {exc}"
        return fit_envelope(ControlEnvelope(status="invalid", path=path, reason=reason))


def _attach_facts(envelope: ControlEnvelope, facts: dict[str, Any]) -> ControlEnvelope:
    """The checkpoint's facts in the envelope; when they do not all fit, a candidate's own facts
    (the operator selects among the candidates by them) before the id alone."""
    attached = attach_checkpoint(envelope, facts)
    if attached.checkpoint == facts or not isinstance(facts.get("candidate"), dict):
        return attached
    return attach_checkpoint(envelope, {"id": facts.get("id"), "candidate": facts["candidate"]})


def finish_candidate(checkpoint: CheckpointArgs, checkpoint_facts: str, main_ended: bool) -> None:
    """After `main` of a candidate pod: record its work tree (`record_candidate`) and keep the facts
    for the report; never raises."""
    facts = load_facts(checkpoint_facts) or {"id": checkpoint.checkpoint_id}
    facts = record_candidate(checkpoint, facts, main_ended)
    _log(f"candidate: {json.dumps(facts.get('candidate'), separators=(',', ':'))}")
    try:
        save_facts(checkpoint_facts, facts)
    except OSError as exc:
        _log(f"cannot keep the candidate's facts in {checkpoint_facts}: {exc}")


def block_wait_signals() -> None:
    """Hold SIGTERM/SIGINT pending from now on, so one arriving early is not lost.

    Blocking (rather than a handler) also matters when the reporter is PID 1 of its container: the
    kernel drops a default-disposition SIGTERM sent to PID 1, but keeps a blocked one pending.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, _WAIT_SIGNALS)


def wait_for_signal() -> int:
    """Sleep (no polling) until SIGTERM or SIGINT; returns the signal number."""
    return int(signal.sigwait(_WAIT_SIGNALS))


def _signalled(timeout: float) -> bool:
    """Sleep up to ``timeout`` seconds, or less when SIGTERM/SIGINT (held pending) arrives: True then."""
    return signal.sigtimedwait(_WAIT_SIGNALS, timeout) is not None


def wait_for_main(hook_done: str, gate: GateFiles | None = None, claimed: bool = False) -> str:
    """Block until `main` has ended (control/mainwatch.py), or SIGTERM/SIGINT arrives; says which.

    First the postStart hook's last line (its watermark and PID: `main` may start once the hook has
    ended), then looks at the pod's processes every `WATCH_POLL` seconds (`WATCH_POLL_LATER` once
    `main` has run for `WATCH_FAST_SECONDS`: an agent that works for minutes does not need its end
    seen within milliseconds). The reporter creates no process or thread meanwhile: one would take a
    PID of the pod's namespace after the hook's watermark and read as `main` (control/mainwatch.py).

    With `gate` and `claimed` (this pod holds the Job's claim), a hook the kubelet went past without
    completing it (control/gate.py) is not waited for: the reporter takes the watermark itself and
    opens `main`'s gate."""
    from agentrun_operator.control.mainwatch import MainWatch, before_main, look

    done = wait_for_gate(hook_done, gate, claimed)
    if done is None:
        return "signal"
    watermark, hook_pid = done
    ignore = frozenset(p for p in (os.getpid(), hook_pid) if p is not None)
    watch = MainWatch(watermark)
    if watermark is None:
        _log("no watermark from the postStart hook: a main that ends within a look may be missed")
    since = time.monotonic()
    before = before_main(ignore, watermark)
    seen = look(ignore, watermark=watermark, before=before)
    while not watch.observe(seen):
        fast = not watch.started or time.monotonic() - since < WATCH_FAST_SECONDS
        if _signalled(WATCH_POLL if fast else WATCH_POLL_LATER):
            return "signal"
        seen = look(ignore, watermark=watermark, before=before)
    pids = ",".join(str(p) for p in sorted(watch.seen)) or "none listed"
    return f"main ended (its processes: {pids}; last PID {seen.last_pid}, {watermark} before main)"


def wait_for_gate(
    hook_done: str, gate: GateFiles | None = None, claimed: bool = False
) -> tuple[int | None, int | None] | None:
    """Block until `main`'s gate is open: the postStart hook's last line (its watermark and PID), or,
    with `gate` and `claimed`, the reporter's own opening of it for a hook the kubelet went past
    (`_open_for_lost_hook`); None when SIGTERM/SIGINT came first."""
    from agentrun_operator.control.mainwatch import read_hook_done

    done = read_hook_done(hook_done)
    said = ""
    while done is None:
        if _signalled(HOOK_POLL):
            return None
        done = read_hook_done(hook_done)
        if done is None and gate is not None and claimed and os.path.isdir(gate.knock):
            done, waiting = _open_for_lost_hook(gate, hook_done)
            if waiting and waiting != said:
                _log(waiting)
                said = waiting
    return done


def _open_for_lost_hook(gate: GateFiles, hook_done: str) -> tuple[tuple[int | None, int | None] | None, str]:
    """The kubelet knocked at `main`'s gate (it tried to start `main`): when the hook will never
    complete (`gate.hook_lost`), take the namespace's last PID as the watermark, then open the gate
    (nothing of `main` has run: the gate was shut). (The watermark, or the hook's last line, or None
    to wait on; what the reporter waits for.)"""
    from agentrun_operator.control.gate import hook_lost, hook_running, is_shut, open_gate
    from agentrun_operator.control.mainwatch import last_pid, read_hook_done

    done = read_hook_done(hook_done)  # again, after the knock: the usual hook wrote it before
    if done is not None:
        return done, ""
    failed = os.path.exists(gate.hook_failed)
    shut = is_shut(gate.gate)
    alive = hook_running(frozenset({os.getpid()}))
    lost = hook_lost(
        claimed=True, hook_done=False, hook_failed=failed, knocked=True, shut=shut, hook_alive=alive
    )
    if not lost:
        if failed:
            why = "the postStart hook failed: waiting for the kubelet to stop this container"
        elif alive:
            why = "the kubelet tried to start main while the postStart hook still runs: waiting for it"
        else:
            why = (
                f"the postStart hook never completed, but main's gate {gate.gate} is open: main may "
                "have run without a watermark; waiting for the hook's last line or a signal"
            )
        return None, why
    watermark = last_pid()
    try:
        open_gate(gate.gate)
    except OSError as exc:
        return (
            None,
            f"the postStart hook never completed, and main's gate {gate.gate} cannot be opened: {exc}",
        )
    _log(
        "the postStart hook never completed (the kubelet went on to main without it: it restarted "
        f"meanwhile, {gate.knock}); opened main's gate {gate.gate} at PID {watermark}"
    )
    return (watermark, None), ""


def _refuse(why: str, termination_log: str, ready_file: str | None, word: str, code: int) -> int:
    """A reporter that will not let `main` start: why, in its termination message (the operator fails
    the attempt with it); `word` in its ready file, so the hook keeps `main`'s gate shut; `code`."""
    _log(why)
    try:
        with open(termination_log, "w", encoding="utf-8") as handle:
            handle.write(why)
    except Exception as exc:
        _log(f"cannot write the termination message to {termination_log}: {exc}")
    if ready_file:
        try:
            _write_atomically(ready_file, word)
        except Exception as exc:
            _log(f"cannot write the ready file {ready_file}: {exc}")
    return code


def refuse_blind(why: str, termination_log: str, ready_file: str | None) -> int:
    """A reporter that cannot see `main`: `blind` in its ready file, `BLIND_EXIT`. Nothing is
    claimed: the pod never runs `main`."""
    return _refuse(why, termination_log, ready_file, BLIND, BLIND_EXIT)


def refuse_checkpoint(why: str, termination_log: str, ready_file: str | None) -> int:
    """The checkpoint failed before `main` (control/checkpointing.py; the operator fails the attempt
    with why, `CheckpointFailed`): the ready file says `checkpoint`; `CHECKPOINT_EXIT`."""
    return _refuse(why, termination_log, ready_file, REFUSED, CHECKPOINT_EXIT)


def cmd_report(
    path: str,
    fingerprint_path: str | None,
    termination_log: str,
    wait: bool,
    ready_file: str | None,
    claim_report: str | None = None,
    before_main: bool = False,
    claim_dir: str | None = None,
    claim_volume: str = "",
    checkout: str | None = None,
    artifacts: Sequence[str] = (),
    hook_done: str | None = None,
    checkpoint: CheckpointArgs | None = None,
    checkpoint_facts: str | None = None,
    gate: GateFiles | None = None,
) -> int:
    """Report the control envelope (after SIGTERM when ``wait``; once `main` has ended, or at SIGTERM,
    with ``hook_done``); exit 0 whatever happens.

    With ``before_main``, first claim the Job and fingerprint the control file
    (`prepare_for_main`); the ready file then holds the reporter's pid, or ``taken`` (a duplicate
    pod), which the postStart hook waits for (docs/design.md#reporter-first). With ``gate``, the
    reporter first shuts `main`'s gate when nothing made it yet, and opens it when the kubelet went on
    to `main` without completing the hook (control/gate.py). A candidate pod records its work tree
    after `main` (`finish_candidate`), before the report carries the facts."""
    if gate is not None and before_main:
        _shut_gate(gate.gate)
    if wait or hook_done:
        block_wait_signals()  # main() did this already; repeating it is harmless
    if hook_done and before_main:
        from agentrun_operator.control.mainwatch import blind_reason, parent_pid

        blind = blind_reason(os.getpid(), parent_pid)
        if blind is not None:
            return refuse_blind(blind, termination_log, ready_file)
    try:
        prepared = not (before_main and fingerprint_path) or prepare_for_main(
            path,
            fingerprint_path,
            claim_dir,
            claim_volume,
            claim_report,
            checkout,
            checkpoint,
            checkpoint_facts,
        )
    except CheckpointRefusal as refusal:
        return refuse_checkpoint(str(refusal), termination_log, ready_file)
    ready = str(os.getpid()) if prepared else TAKEN
    if ready_file:
        try:
            _write_atomically(ready_file, ready)
        except Exception as exc:
            _log(f"cannot write the ready file {ready_file}: {exc}")
    main_ended = True
    if hook_done:
        why = wait_for_main(hook_done, gate, claimed=before_main and prepared)
        main_ended = why != "signal"
        _log(f"{why}; reporting {path}")
    elif wait:
        signum = wait_for_signal()
        _log(f"got {signal.Signals(signum).name}; reporting {path}")
    if (
        before_main
        and fingerprint_path
        and prepared
        and checkpoint is not None
        and checkpoint.candidate is not None
        and checkpoint_facts
    ):
        finish_candidate(checkpoint, checkpoint_facts, main_ended)
    text = report_text(path, fingerprint_path, claim_report, checkout, artifacts, checkpoint_facts)
    try:
        with open(termination_log, "w", encoding="utf-8") as handle:
            handle.write(text)
    except Exception as exc:
        _log(f"cannot write the termination message to {termination_log}: {exc}")
    with contextlib.suppress(Exception):  # a closed stdout must not change the exit code
        print(text, flush=True)
    return 0


# ------------------------------------------------------------------------------------ warm pods


@dataclass(frozen=True)
class IterationReports:
    """How a warm pod reads each iteration's control file: as a cold reporter does (control/warm.py
    `Reports`)."""

    path: str
    fingerprint: str
    claim_report: str | None
    checkout: str | None
    artifacts: tuple[str, ...]

    def fingerprint_again(self) -> None:
        record_fingerprint(self.path, self.fingerprint, self.checkout)

    def report(self, first: bool) -> ControlEnvelope:
        claim_report = self.claim_report if first else None
        return report_envelope(self.path, self.fingerprint, claim_report, self.checkout, self.artifacts)


def cmd_warm(args: argparse.Namespace) -> int:
    """A warm pod's reporter (docs/design.md#warm-pod): its usual work before `main` (the gate shut,
    the claim, the fingerprint), then the warm directory, its FIFO and the channel's socket before
    the ready file; once `main`'s gate is open, the supervisor (control/warm.py) runs the iterations
    until it is stopped, idle or signalled; its termination message is the last iteration's envelope.

    It does not watch /proc, so it does not refuse to run blind; it does refuse (before the claim, or
    before the ready file) when it has no key or cannot open the channel: `main` never starts then."""
    from agentrun_operator.control import warm, warm_server

    gate = gate_files(args)
    if gate is not None:
        _shut_gate(gate.gate)
    block_wait_signals()
    try:
        key = warm.read_key(args.warm_key_file)
        warm.valid_id(args.warm_first_id)
    except warm.Refusal as refusal:
        return refuse_warm(f"warm pod: {refusal.message}", args.termination_log, args.ready_file)
    if not prepare_for_main(
        args.path, args.fingerprint, args.claim_dir, args.claim_volume, args.claim_report, args.checkout
    ):
        return _duplicate_warm_pod(args)
    settings = warm.Settings(args.warm_dir, args.warm_first_id, args.warm_idle_seconds, args.path)
    reports = IterationReports(
        args.path, args.fingerprint, args.claim_report, args.checkout, tuple(args.artifact)
    )
    supervisor = warm.Supervisor(settings, reports)
    host = os.environ.get(warm.POD_IP_ENV) or "0.0.0.0"
    try:
        warm.make_channel(args.warm_dir)
        server = warm_server.listen(host, args.warm_port, supervisor, key)
    except OSError as exc:
        why = f"warm pod: cannot open the channel ({args.warm_dir}, {host}:{args.warm_port}): {exc}"
        return refuse_warm(why, args.termination_log, args.ready_file)
    if args.ready_file:
        try:
            _write_atomically(args.ready_file, str(os.getpid()))
        except Exception as exc:
            _log(f"cannot write the ready file {args.ready_file}: {exc}")
    warm_server.serve_in_background(server)
    warm.log(
        f"listening on {server.server_name}:{server.server_port}; iteration {args.warm_first_id} waits "
        "for main's gate"
    )
    why = "signal"
    try:
        gate_open = wait_for_gate(args.hook_done, gate, claimed=True) is not None
        if gate_open and supervisor.hand_first(warm.signalled):
            why = supervisor.run(warm.signalled)
    except Exception as exc:  # the report must not be lost: the message still says what ended
        why = f"failed: {type(exc).__name__}: {exc}"
    supervisor.close()
    text = supervisor.termination_text()
    try:
        with open(args.termination_log, "w", encoding="utf-8") as handle:
            handle.write(text)
    except Exception as exc:
        _log(f"cannot write the termination message to {args.termination_log}: {exc}")
    server.shutdown()
    server.wait_answered(warm.LAST_ANSWERS_SECONDS)
    server.server_close()
    warm.log(f"ended ({why})")
    with contextlib.suppress(Exception):
        print(text, flush=True)
    return 0


def refuse_warm(why: str, termination_log: str, ready_file: str | None) -> int:
    """A warm reporter without its key or channel: the ready file says `nochannel`; `WARM_EXIT`."""
    return _refuse(why, termination_log, ready_file, NO_CHANNEL, WARM_EXIT)


def _duplicate_warm_pod(args: argparse.Namespace) -> int:
    """A duplicate pod of the Job (another holds its claim): as a cold one, `taken` in the ready file
    (the hook keeps `main` shut), then, at SIGTERM, the report with the claim's outcome."""
    if args.ready_file:
        try:
            _write_atomically(args.ready_file, TAKEN)
        except Exception as exc:
            _log(f"cannot write the ready file {args.ready_file}: {exc}")
    wait_for_signal()
    text = report_text(args.path, args.fingerprint, args.claim_report)
    try:
        with open(args.termination_log, "w", encoding="utf-8") as handle:
            handle.write(text)
    except Exception as exc:
        _log(f"cannot write the termination message to {args.termination_log}: {exc}")
    return 0


# ------------------------------------------------------------------------------------------ CLI


def _shut_gate(path: str) -> None:
    from agentrun_operator.control.gate import shut_if_missing

    try:
        shut_if_missing(path)
    except OSError as exc:  # the hook shuts it too
        _log(f"cannot shut main's gate {path}: {exc}")


def build_parser(prog: str = "agentrun reporter") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Carry an iteration's loop-control file out of its pod."
    )
    sub = parser.add_subparsers(dest="reporter_command", required=True)

    fp = sub.add_parser("fingerprint", help="init container: record the control file before main runs")
    fp.add_argument("--path", required=True, help="the control file (absolute path)")
    fp.add_argument("--out", required=True, help="where to write the fingerprint JSON (shared emptyDir)")
    fp.add_argument(
        "--reporter-ready",
        metavar="FILE",
        help="first wait until the reporter sidecar has created FILE (its --ready-file)",
    )
    fp.add_argument(
        "--ready-timeout",
        type=float,
        default=DEFAULT_READY_TIMEOUT,
        metavar="SECONDS",
        help=f"give up waiting for --reporter-ready after this long (default {DEFAULT_READY_TIMEOUT:g})",
    )
    fp.add_argument(
        "--claim-dir",
        metavar="DIR",
        help="claim the Job for this pod in DIR first; a duplicate pod of the Job waits there forever",
    )
    fp.add_argument("--job-uid", default="", help="the Job's uid (the pod's controller-uid label)")
    fp.add_argument("--pod-uid", default="", help="this pod's uid")
    fp.add_argument("--claim-volume", default="", help="the pod volume's name of --claim-dir (for reports)")
    fp.add_argument(
        "--termination-log",
        metavar="FILE",
        help="write the claim's outcome (JSON) here: a terminationMessagePath, or --claim-report's file",
    )
    fp.add_argument("--checkout", metavar="DIR", help="record the commit the Git checkout DIR is at")

    rep = sub.add_parser("report", help="sidecar: write the control envelope to the termination message")
    rep.add_argument("--path", required=True, help="the control file (absolute path)")
    rep.add_argument("--fingerprint", help="the fingerprint written by `fingerprint --out`")
    rep.add_argument("--termination-log", default="/dev/termination-log", help="the terminationMessagePath")
    rep.add_argument(
        "--wait-for-signal",
        action="store_true",
        help="sleep until SIGTERM (sent when the main container has ended), then report",
    )
    rep.add_argument(
        "--hook-done",
        metavar="FILE",
        help="a regular container before main: once the postStart hook has written FILE (its "
        "watermark and pid), watch the pod's shared PID namespace and report when main has ended "
        "(or at SIGTERM)",
    )
    rep.add_argument("--ready-file", metavar="FILE", help="create FILE once SIGTERM can no longer be lost")
    rep.add_argument(
        "--before-main",
        action="store_true",
        help="first claim the Job (with --claim-dir) and write the fingerprint (--fingerprint); the "
        "ready file then holds the reporter's pid, or taken in a duplicate pod",
    )
    rep.add_argument("--claim-dir", metavar="DIR", help="claim the Job for this pod in DIR (--before-main)")
    rep.add_argument("--claim-volume", default="", help="the pod volume's name of --claim-dir (for reports)")
    rep.add_argument(
        "--claim-report",
        metavar="FILE",
        help="where the claim's outcome is kept; put in the envelope when it is news",
    )
    rep.add_argument(
        "--checkout",
        metavar="DIR",
        help="record the commit the Git checkout DIR is at before main (--before-main), and report "
        "it after main when it moved",
    )
    rep.add_argument(
        "--artifact",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="report the size and sha256 of an output artifact (repeatable)",
    )
    rep.add_argument(
        "--gate",
        metavar="FILE",
        help="main's gate (--before-main): shut it at once when missing; with --knock and "
        "--hook-failed, open it when the kubelet went on to main without completing the postStart hook",
    )
    rep.add_argument("--knock", metavar="DIR", help="made by the kubelet once it tried to start main")
    rep.add_argument("--hook-failed", metavar="FILE", help="written by the postStart hook when it fails")
    rep.add_argument("--checkpoint-root", metavar="DIR", help="loop.checkpoint: the state volume's mountPath")
    rep.add_argument(
        "--checkpoint-id", metavar="ID", help="the iteration's checkpoint (naming.checkpoint_id)"
    )
    rep.add_argument("--checkpoint-prefix", default="", help="the loop's checkpoint ids start with it")
    rep.add_argument("--checkpoint-keep", type=int, default=10, help="checkpoints of the loop kept")
    rep.add_argument("--checkpoint-exclude", action="append", default=[], metavar="PATH", help="not recorded")
    rep.add_argument("--checkpoint-restore", action="store_true", help="restore the iteration's checkpoint")
    rep.add_argument("--checkpoint-expected", action="store_true", help="an earlier attempt recorded it")
    rep.add_argument("--checkpoint-from", metavar="ID", help="a resumed run: first restore this checkpoint")
    rep.add_argument("--checkpoint-owner", default="", help="the run's uid")
    rep.add_argument("--checkpoint-facts", metavar="FILE", help="where the checkpoint's facts are kept")
    rep.add_argument(
        "--candidate-index", metavar="N", help="loop.candidates: this pod's candidate (job-completion-index)"
    )
    rep.add_argument(
        "--candidate-dir",
        metavar="DIR",
        help="the candidate's work tree: <checkpoint-root>/.agentrun/candidates/<checkpoint-id>/<N>",
    )
    rep.add_argument(
        "--candidate-checkpoint", metavar="ID", help="record the candidate's end as ID: <checkpoint-id>c<N>"
    )
    warm = rep.add_argument_group("warm pods (loop.warm, docs/design.md#warm-iterations)")
    warm.add_argument(
        "--warm",
        action="store_true",
        help="supervise main's loop of iterations and serve the operator's channel (needs --fingerprint "
        "and --hook-done; implies --before-main)",
    )
    warm.add_argument("--warm-port", type=int, default=8471, metavar="PORT", help="the channel's port")
    warm.add_argument("--warm-key-file", metavar="FILE", help="the run's key (signs the channel)")
    warm.add_argument("--warm-dir", metavar="DIR", help="where main's loop finds its FIFO and iterations")
    warm.add_argument("--warm-first-id", metavar="ID", help="the pod's first iteration, started at once")
    warm.add_argument(
        "--warm-idle-seconds",
        type=float,
        default=60.0,
        metavar="N",
        help="end main's loop and the pod N seconds after the last result was acknowledged",
    )
    return parser


def _warm_problem(args: argparse.Namespace) -> str | None:
    """Why the arguments do not make a warm reporter; None when they do."""
    missing = [
        option
        for option, value in (
            ("--fingerprint", args.fingerprint),
            ("--hook-done", args.hook_done),
            ("--warm-key-file", args.warm_key_file),
            ("--warm-dir", args.warm_dir),
            ("--warm-first-id", args.warm_first_id),
        )
        if not value
    ]
    if missing:
        return f"--warm needs {', '.join(missing)}"
    if args.wait_for_signal or args.checkpoint_root or args.candidate_index is not None:
        return "--warm takes no --wait-for-signal, --checkpoint-* or --candidate-*"
    if not 0 <= args.warm_port <= 65535 or not args.warm_idle_seconds >= 0:
        return "--warm-port must be a port number and --warm-idle-seconds 0 or more"
    return None


def checkpoint_args(args: argparse.Namespace) -> CheckpointArgs | None:
    """The checkpoint arguments, when the pod's loop has checkpoints."""
    if not args.checkpoint_root or not args.checkpoint_id:
        return None
    candidate, problem = None, ""
    try:
        candidate = parse_candidate(
            args.checkpoint_root,
            args.checkpoint_id,
            args.candidate_index,
            args.candidate_dir,
            args.candidate_checkpoint,
        )
    except CheckpointRefusal as refusal:  # refused before main, in the termination message
        problem = str(refusal)
    return CheckpointArgs(
        root=args.checkpoint_root,
        checkpoint_id=args.checkpoint_id,
        prefix=args.checkpoint_prefix,
        keep=args.checkpoint_keep,
        exclude=tuple(args.checkpoint_exclude),
        restore_own=args.checkpoint_restore,
        expected=args.checkpoint_expected,
        restore_from=args.checkpoint_from,
        owner=args.checkpoint_owner,
        candidate=candidate,
        candidate_problem=problem,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``agentrun reporter``; ``argv`` excludes the program and ``reporter`` words."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["report"] and ({"--wait-for-signal", "--hook-done", "--warm"} & set(args_list)):
        block_wait_signals()  # before argparse or anything else that takes time
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.reporter_command == "report" and args.warm:
        problem = _warm_problem(args)
        if problem is not None:
            parser.error(problem)
        return cmd_warm(args)
    if args.reporter_command == "fingerprint":
        return cmd_fingerprint(
            args.path,
            args.out,
            args.reporter_ready,
            args.ready_timeout,
            args.claim_dir,
            args.job_uid,
            args.pod_uid,
            args.claim_volume,
            args.termination_log,
            args.checkout,
        )
    return cmd_report(
        args.path,
        args.fingerprint,
        args.termination_log,
        args.wait_for_signal,
        args.ready_file,
        args.claim_report,
        args.before_main,
        args.claim_dir,
        args.claim_volume,
        args.checkout,
        args.artifact,
        args.hook_done,
        checkpoint_args(args),
        args.checkpoint_facts,
        gate_files(args),
    )


def gate_files(args: argparse.Namespace) -> GateFiles | None:
    """`main`'s gate and what tells the reporter the kubelet went past the hook; None without them
    (a pod of an earlier build)."""
    if not args.gate or not args.knock or not args.hook_failed:
        return None
    return GateFiles(gate=args.gate, knock=args.knock, hook_failed=args.hook_failed)


if __name__ == "__main__":
    sys.exit(main())
