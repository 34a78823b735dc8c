"""Each pod's own loopback address: its `status.podIP` on the pod runner (docs/local-dev.md#network).

Pods share the host's network, so with one pod IP for all (the host's 127.0.0.1) two pods serving
the same port on their pod IP would collide. Linux routes the whole of 127.0.0.0/8 to `lo`, so any
address in it can be bound by any process, with no setup and no root: each pod the runner starts
gets one of its own from `POD_ADDRESSES`, the host reaches it there, and the pod binds it as it
would bind its pod IP on a node.

The address is derived from the pod's uid (the first free one from where the uid's hash points),
reserved in `<state>/run/pod-addresses/<address>` (the pod's directory in it) and recorded in the
pod's own directory (`<pod>/pod-ip`). A runner restarted under running pods gives each adopted pod
the address it recorded, and never hands an address whose pod still runs to another: a reservation
is taken over only when its pod has no worker in this runner and nothing of it runs. An address that
any socket on the host is bound to (another runner's pod, on another state directory) is skipped.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

POD_ADDRESSES: Final = ipaddress.IPv4Network("127.64.0.0/10")
"""About four million loopback addresses, far from 127.0.0.0/16 (127.0.0.1, Debian's 127.0.1.1 for
the host name, systemd-resolved's 127.0.0.53): pods of two runners on one host (two test workers,
two checkouts) rarely meet, and one bound already is skipped."""
_BLOCKS: Final = POD_ADDRESSES.num_addresses // 256
_HOSTS: Final = 254
"""Per /24 of the range, .1 to .254: no address ends in .0 or .255 (some tools take them for a
network or a broadcast address)."""
RECORD: Final = "pod-ip"
RESERVATIONS: Final = "pod-addresses"


def candidates(uid: str) -> Iterator[str]:
    """Every pod address, in the order a pod of this uid tries them: from the one its uid hashes to."""
    size = _BLOCKS * _HOSTS
    start = int.from_bytes(hashlib.sha256(uid.encode()).digest()[:8], "big") % size
    first = int(POD_ADDRESSES.network_address)
    for step in range(size):
        n = (start + step) % size
        yield str(ipaddress.IPv4Address(first + (n // _HOSTS) * 256 + 1 + n % _HOSTS))


def _proc_net_addresses(text: str) -> set[str]:
    """The local IPv4 addresses of the sockets in a /proc/net/{tcp,udp} table (the kernel prints
    each address as a hex number in host byte order)."""
    found = set()
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 1:
            with contextlib.suppress(ValueError, struct.error):
                found.add(socket.inet_ntoa(struct.pack("=I", int(fields[1].split(":")[0], 16))))
    return found


def bound_addresses() -> set[str]:
    """The IPv4 addresses that some TCP or UDP socket of the host's network namespace is bound to."""
    found: set[str] = set()
    for table in ("tcp", "udp"):
        with contextlib.suppress(OSError):
            found |= _proc_net_addresses(Path("/proc/net", table).read_text())
    return found


class PodAddresses:
    """The runner's pod addresses (see the module docstring). `live(pod_dir)` says whether the pod
    of a directory still holds its address (a worker of this runner has it, or its containers run)."""

    def __init__(
        self,
        run_dir: Path,
        live: Callable[[Path], bool],
        bound: Callable[[], set[str]] = bound_addresses,
    ) -> None:
        self.directory = run_dir / RESERVATIONS
        self.live = live
        self.bound = bound
        self.lock = threading.Lock()

    @staticmethod
    def recorded(pod_dir: Path) -> str | None:
        """The address the pod's directory records (None: it never had one here)."""
        try:
            text = (pod_dir / RECORD).read_text().strip()
            return str(ipaddress.IPv4Address(text)) if text else None
        except (OSError, ValueError):
            return None

    def _holder(self, address: str) -> Path | None:
        try:
            text = (self.directory / address).read_text().strip()
        except OSError:
            return None
        return Path(text) if text else None

    def _reserve(self, address: str, pod_dir: Path) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{address}.tmp"
        tmp.write_text(f"{pod_dir}\n")
        tmp.replace(self.directory / address)

    def keep(self, pod_dir: Path) -> str | None:
        """The address an earlier runner process gave this pod, reserved for it again; None when it
        has none (a pod started before pods had addresses of their own: its status keeps its IP)."""
        with self.lock:
            address = self.recorded(pod_dir)
            if address is not None and self._holder(address) != pod_dir:
                self._reserve(address, pod_dir)
            return address

    def assign(self, pod_dir: Path, uid: str) -> str:
        """The pod's address: the one it recorded, else the first free one of its candidates,
        reserved and recorded. OSError when none is free (or the state cannot be written)."""
        with self.lock:
            address = self.recorded(pod_dir)
            if address is not None:
                if self._holder(address) != pod_dir:
                    self._reserve(address, pod_dir)
                return address
            bound = self.bound()
            for candidate in candidates(uid):
                if candidate in bound:
                    continue
                holder = self._holder(candidate)
                if holder is not None and holder != pod_dir and self.live(holder):
                    continue
                self._reserve(candidate, pod_dir)
                pod_dir.mkdir(parents=True, exist_ok=True)
                (pod_dir / RECORD).write_text(f"{candidate}\n")
                return candidate
        raise OSError(f"no free pod address left in {POD_ADDRESSES}")

    def release(self, pod_dir: Path) -> None:
        """The pod is gone: its address is free again (its record stays, with the pod's logs)."""
        with self.lock:
            address = self.recorded(pod_dir)
            if address is not None and self._holder(address) == pod_dir:
                (self.directory / address).unlink(missing_ok=True)
