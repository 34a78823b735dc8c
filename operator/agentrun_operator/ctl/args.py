"""The flags of the cluster commands (`status`, `watch`, `cancel`), kept apart from the client code so
building the CLI's parser imports nothing heavy: `agentrun reporter` starts in every iteration pod."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser, *, output: bool = True) -> None:
    """The flags every command that talks to a cluster takes, named as kubectl names them."""
    parser.add_argument("name", metavar="NAME", help="the AgentRun's name")
    parser.add_argument("-n", "--namespace", help="namespace (default: the context's, else default)")
    parser.add_argument("--context", help="kubeconfig context (default: the current context)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    if output:
        parser.add_argument("-o", "--output", choices=["json", "yaml"], help="print the AgentRun object")
