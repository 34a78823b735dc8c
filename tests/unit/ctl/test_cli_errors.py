"""The cluster commands fail with one line and exit 4 when they cannot ask (no cluster needed here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrun_operator.cli import main


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return tmp_path


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    return lines[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "r"],
        ["watch", "r"],
        ["cancel", "r", "--graceful"],
        ["approve", "r", "--step", "a/b", "--input", "v=1"],
        ["reject", "r", "--step", "a/b", "--reason", "no"],
    ],
)
def test_no_kubeconfig(argv: list[str], no_credentials: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 4
    line = one_line_error(capsys)
    assert line.startswith(f"agentrun {argv[0]}: no kubeconfig found")
    assert "--kubeconfig" in line


def test_named_kubeconfig_missing(no_credentials: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "r", "--kubeconfig", str(no_credentials / "nope")]) == 4
    assert "does not exist (from --kubeconfig)" in one_line_error(capsys)


KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: dev, context: {cluster: c, user: u, namespace: team}}]
current-context: dev
"""


def test_unknown_context(no_credentials: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = no_credentials / "config"
    path.write_text(KUBECONFIG)
    assert main(["watch", "r", "--kubeconfig", str(path), "--context", "prod"]) == 4
    assert "context 'prod' is not in kubeconfig" in one_line_error(capsys)


def test_empty_kubeconfig_is_named_not_a_python_error(
    no_credentials: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = no_credentials / "empty"
    empty.write_text("\n")
    assert main(["status", "r", "--kubeconfig", str(empty)]) == 4
    assert one_line_error(capsys) == (
        f"agentrun status: kubeconfig {empty} is empty: "
        "pass --kubeconfig FILE or set KUBECONFIG to a kubeconfig"
    )
    # In a $KUBECONFIG list an empty file is skipped, as kubectl skips it.
    path = no_credentials / "config"
    path.write_text(KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", f"{empty}:{path}")
    assert main(["status", "r"]) == 4
    assert "cannot reach the API server at https://127.0.0.1:1" in one_line_error(capsys)


def test_unreachable_api_server(no_credentials: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = no_credentials / "config"
    path.write_text(KUBECONFIG)
    assert main(["status", "r", "--kubeconfig", str(path)]) == 4
    assert "cannot reach the API server at https://127.0.0.1:1" in one_line_error(capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["watch"],
        ["status", "r", "-o", "table"],
        ["cancel", "r", "--now"],
        ["approve", "r"],
        ["reject", "r", "--step", "a/sign-off"],
        ["approve", "r", "--step", "s", "--iteration", "two"],
    ],
)
def test_bad_arguments_exit_4_not_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """2 means Cancelled for `watch`, so argument errors of the cluster commands use 4."""
    assert main(argv) == 4
    assert "usage:" in capsys.readouterr().err


def test_in_cluster_credentials_and_namespace(no_credentials: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No kubeconfig, in a pod: the ServiceAccount's token, CA and namespace, as kubectl uses them."""
    import asyncio

    from agentrun_operator.ctl import connect

    account = no_credentials / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("tok3n")
    from agentrun_devcluster.pki import PKIPaths, ensure_pki

    ensure_pki(no_credentials / "pki")  # any real CA certificate
    (account / "ca.crt").write_bytes(PKIPaths(no_credentials / "pki").ca_cert.read_bytes())
    (account / "namespace").write_text("team-a\n")
    monkeypatch.setattr(connect, "SERVICE_ACCOUNT_DIR", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")

    async def resolve(namespace: str | None) -> tuple[str, str, str, str]:
        target = await connect.connect(None, None, namespace)
        try:
            token = target.kube.configuration.api_key["BearerToken"]
            return target.namespace, target.server, target.source, token
        finally:
            await target.kube.close()

    assert asyncio.run(resolve(None)) == (
        "team-a",
        "https://10.0.0.1:443",
        "in-cluster ServiceAccount",
        "Bearer tok3n",
    )
    assert asyncio.run(resolve("other"))[0] == "other"
    with pytest.raises(connect.CtlError, match="--context prod needs a kubeconfig"):
        asyncio.run(connect.connect(None, "prod", None))


def test_building_the_parser_imports_no_client() -> None:
    """`agentrun reporter` runs twice in every iteration pod: the CLI's parser must stay light."""
    import subprocess
    import sys

    code = (
        "import sys; from agentrun_operator.cli import build_parser; build_parser(); "
        "heavy = ('kubernetes_asyncio', 'aiohttp', 'agentrun_operator.ctl.commands'); "
        "heavy = [m for m in heavy if m in sys.modules]; "
        "print(heavy)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
