"""Entry of `agentrun status | watch | cancel | approve | reject`: connect, run the command, turn
failures into one line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
from typing import TextIO

import aiohttp

from agentrun_operator.ctl import commands, render, timeline
from agentrun_operator.ctl.connect import CtlError, Target, connect


def wants_colour(stream: TextIO) -> bool:
    """Colour only on a terminal, and never with NO_COLOR or TERM=dumb (CI logs get plain text)."""
    isatty = getattr(stream, "isatty", None)
    return bool(
        isatty is not None
        and isatty()
        and not os.environ.get("NO_COLOR")
        and os.environ.get("TERM", "") != "dumb"
    )


def bar_width(stream: TextIO) -> int:
    """The timeline's bars fill what the terminal leaves beside the labels and notes (COLUMNS first,
    as shells export it); piped output gets the default width, so it reads the same in a CI log."""
    isatty = getattr(stream, "isatty", None)
    if isatty is None or not isatty():
        return timeline.DEFAULT_WIDTH
    columns = shutil.get_terminal_size((timeline.DEFAULT_WIDTH + 80, 24)).columns
    return max(timeline.MIN_WIDTH, min(columns - 80, 2 * timeline.DEFAULT_WIDTH))


def parse_inputs(pairs: list[str]) -> dict[str, str]:
    """`--input KEY=VALUE` (repeatable) as a map; a pair without `=` or a key given twice is refused."""
    inputs: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CtlError(
                f"--input: {pair!r} is not KEY=VALUE (value: {pair!r}; fix: e.g. --input verdict=ship; "
                "see docs/concepts.md#approval-gates)"
            )
        if key in inputs:
            raise CtlError(
                f"--input: {key!r} is given twice (value: {pair!r}; fix: give each input once; "
                "see docs/concepts.md#approval-gates)"
            )
        inputs[key] = value
    return inputs


async def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    target: Target | None = None
    try:
        target = await connect(args.kubeconfig, args.context, args.namespace)
        output = getattr(args, "output", None) or ""
        if args.command == "status":
            timeline = getattr(args, "timeline", False)
            return await commands.status(
                target, args.name, output, wants_colour(out), out, timeline=timeline, width=bar_width(out)
            )
        if args.command == "watch":
            return await commands.watch(target, args.name, output, wants_colour(out), args.timeout, out, err)
        if args.command == "cancel":
            return await commands.cancel(target, args.name, args.graceful, output, out)
        if args.command in ("approve", "reject"):
            return await commands.decide(
                target,
                args.name,
                args.step,
                "Approved" if args.command == "approve" else "Rejected",
                inputs=parse_inputs(getattr(args, "input", None) or []),
                reason=args.reason,
                iteration=args.iteration,
                output=output,
                out=out,
            )
        if args.command in ("checkpoints", "resume"):
            from agentrun_operator.ctl import checkpoints

            if args.command == "checkpoints":
                return await checkpoints.checkpoints(target, args.name, output, out)
            return await checkpoints.resume(
                target, args.name, args.from_iteration, args.new_name, args.step, output, out
            )
        if args.command == "logs":
            from agentrun_operator.ctl.attempts import Selection
            from agentrun_operator.ctl.logs import logs

            chosen = Selection(args.step, args.iteration, args.attempt)
            return await logs(
                target, args.name, chosen, args.container, args.follow, wants_colour(out), out, err
            )
        raise AssertionError(args.command)
    except aiohttp.ClientError as exc:
        server = target.server if target is not None else "the API server"
        raise CtlError(f"cannot reach the API server at {server}: {exc}") from None
    finally:
        if target is not None:
            await target.kube.close()


def run_ctl(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        return asyncio.run(_run(args, out, err))
    except CtlError as exc:
        err.write(f"agentrun {args.command}: {exc}\n")
        return render.EXIT_ERROR
    except BrokenPipeError:  # `agentrun logs … | head`: the reader has what it wanted
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        return 0
    except KeyboardInterrupt:
        err.write(f"agentrun {args.command}: interrupted\n")
        return 130
    except Exception as exc:  # one line, never a traceback; the type says where to look
        err.write(f"agentrun {args.command}: unexpected {type(exc).__name__}: {exc}\n")
        return render.EXIT_ERROR
