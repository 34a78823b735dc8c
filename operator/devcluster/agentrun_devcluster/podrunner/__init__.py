"""The local pod runner: the kubelet's part of the local default, with real processes
(docs/design.md#real-parts).

It registers a Node, binds pending pods to it and runs their containers in the kubelet's order, as
local processes, each in a bubblewrap sandbox (`bwrap`) where every volume is bind-mounted at its
`mountPath` and the host's root is read-only (images are not pulled: the host's tools run). It
imitates only the kubelet behaviours the product relies on, each checked against the real kubelet
by the node tier (docs/local-dev.md#pod-runner-fidelity).

- `spec` — pure: which containers run in which order, environment and `$(VAR)` expansion, volumes
  and mount checks, termination messages.
- `status` — pure: container records to a `PodStatus` (phase, conditions, container states).
- `sandbox` — the `bwrap` command line (pure) and the check that `bwrap` is installed.
- `api` — a small synchronous API client from a kubeconfig (requests and watches).
- `runtime` — the seam: what a container runtime offers the runner (`ContainerRuntime`).
- `process` — the process runtime (bwrap), and what it keeps for a later runner: `adopt` (launch
  records, shims, leftovers), `pidns` (a pod's shared PID namespace), `procfs` (/proc readers).
- `config` — what the runner is told and where it keeps things.
- `network` — a pod's own network namespace with the API server forwarded into it.
- `runner` — the imperative shell: watches, binds, reports; `worker` — one pod's life cycle.
"""

from __future__ import annotations
