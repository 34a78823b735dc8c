"""Running the project's own commands as an ordinary user (docs/local-dev.md#non-root).

Most people who try the project from its README are not root, while CI is. So a test that must hold
for them runs its commands as an unprivileged user when the test itself is root (`nobody`, with a
HOME of its own in the test's temporary directory), and as itself otherwise. What root owns is made
usable without changing it:

- the interpreter: a venv whose interpreter lives under a directory only root may enter (pyenv's in
  /root) cannot be run by anyone else, so the user gets a venv of its own pointing at an interpreter
  of the same version it can run (the venv's base, or the system's), with the project's
  site-packages (readable where the checkout is) and an `agentrun` script, as `make setup` makes;
- the control plane's tools: root's cache is linked (hard links, else copies) into a cache of the
  user's (`AGENTRUN_CACHE_DIR`), so nothing is rebuilt.

Whatever cannot be arranged fails the test with the reason: no silent skip.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentrun_devcluster.toolchain import cache_root, ensure_tools

USER = "nobody"
"""The unprivileged account root runs the commands as (present on every Debian-like system)."""


@dataclass(frozen=True)
class OrdinaryUser:
    """How to run a command as the user: `prefix` (empty when the test is not root), its env."""

    uid: int
    gid: int
    home: Path
    python: str
    prefix: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def run(
        self, argv: Sequence[str], timeout: float, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix, *argv],
            env=self.env,
            cwd=cwd or self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def agentrun(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.run([self.python, "-m", "agentrun_operator.cli", *args], timeout)


def _as_user(uid: int, gid: int) -> tuple[str, ...]:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise AssertionError("running a command as an ordinary user needs util-linux's setpriv; install it")
    return (setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups")


_PROBE = (
    "import subprocess, sys; subprocess.run([sys.executable, '-c', "
    "'import agentrun_operator.cli, agentrun_devcluster.podrunner.main'], check=True)"
)
"""What `agentrun dev up` does with its interpreter: start it again (`sys.executable`, a path the
user must be able to execute) and import the project."""
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The user's PATH (root's may name directories the user cannot search, e.g. under /root)."""


def _runs(prefix: tuple[str, ...], python: str, env: dict[str, str]) -> str | None:
    """None when the user can run `python` and import the project with it, else what went wrong."""
    probe = _PROBE
    done = subprocess.run(
        [*prefix, python, "-c", probe], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["(no output)"])[-1]


def _user_venv(root: Path, base_python: str, uid: int, gid: int) -> str:
    """A venv at `root` over `base_python` with this venv's site-packages and an `agentrun` script."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(base_python)
    (root / "bin" / "python3").symlink_to("python")
    lib = root / "lib" / f"python{version}"
    lib.mkdir(parents=True)
    (lib / "site-packages").symlink_to(sysconfig.get_paths()["purelib"])
    (root / "pyvenv.cfg").write_text(
        f"home = {Path(base_python).parent}\ninclude-system-site-packages = false\nversion = {version}\n"
    )
    script = root / "bin" / "agentrun"
    script.write_text(
        f"#!{root}/bin/python\nimport sys\nfrom agentrun_operator.cli import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    for path in [root, *root.rglob("*")]:
        os.lchown(path, uid, gid)
    return str(root / "bin" / "python")


def _link_tools(cache: Path, uid: int, gid: int) -> None:
    """Root's built control plane tools into the user's cache (`AGENTRUN_CACHE_DIR`): hard links
    where the file system allows, else copies; the directories are the user's (its build lock)."""
    source = ensure_tools(lambda _line: None)
    target = cache / source.relative_to(cache_root())
    target.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.is_file():
            try:
                os.link(entry, target / entry.name)
            except OSError:
                shutil.copy2(entry, target / entry.name)
    for path in [cache, *cache.rglob("*")]:
        if path.is_dir():
            os.chown(path, uid, gid)


def ordinary_user(tmp: Path) -> OrdinaryUser:
    """The user the test's commands run as, set up under `tmp` (see the module docstring), which
    every user must be able to reach (pytest's own temporary directories are root's alone)."""
    home = tmp / "home"
    home.mkdir()
    base_env = {
        "PATH": SYSTEM_PATH,
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if os.geteuid() != 0:
        env = dict(os.environ, HOME=str(home))
        return OrdinaryUser(os.getuid(), os.getgid(), home, sys.executable, (), env)
    entry = pwd.getpwnam(USER)
    uid, gid = entry.pw_uid, entry.pw_gid
    prefix = _as_user(uid, gid)
    os.chown(home, uid, gid)
    cache = tmp / "cache"
    _link_tools(cache, uid, gid)
    base_env["AGENTRUN_CACHE_DIR"] = str(cache)
    problems = []
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if _runs(prefix, sys.executable, base_env) is None:
        python = sys.executable
    else:
        python = ""
        bases = [
            str(Path(sys.base_prefix) / "bin" / f"python{version}"),
            f"/usr/bin/python{version}",
            f"/usr/local/bin/python{version}",
        ]
        for i, base in enumerate(b for b in bases if os.access(b, os.X_OK)):
            candidate = _user_venv(tmp / f"venv-{i}", base, uid, gid)
            problem = _runs(prefix, candidate, base_env)
            if problem is None:
                python = candidate
                break
            problems.append(f"{base}: {problem}")
        if not python:
            raise AssertionError(
                f"user {USER} can run no Python {version} with this checkout's packages "
                f"({'; '.join(problems) or 'none found'}): install python{version} for everyone "
                "or put the checkout's venv where every user can read it"
            )
    base_env["PATH"] = f"{Path(python).parent}:{base_env['PATH']}"
    return OrdinaryUser(uid, gid, home, python, prefix, base_env)


def kill_leftovers(marker: str) -> list[str]:
    """SIGKILL the processes whose command line names `marker` (the test's own directory: only what
    the test started names it) and say which they were; for a `dev down` that did not finish."""
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                continue
            killed.append(cmdline.replace(b"\0", b" ")[:120].decode(errors="replace"))
    return killed
