"""Each pod's own loopback address on the pod runner (docs/local-dev.md#network): derived from its
uid, unique among the pods that still hold one, recorded so a restarted runner gives it back."""

from __future__ import annotations

import ipaddress
import itertools
import socket
from pathlib import Path

from agentrun_devcluster.podrunner.addresses import (
    POD_ADDRESSES,
    RECORD,
    PodAddresses,
    _proc_net_addresses,
    bound_addresses,
    candidates,
)


def first(uid: str, n: int = 1) -> list[str]:
    return list(itertools.islice(candidates(uid), n))


def test_candidates_are_loopback_addresses_of_the_range_never_a_network_or_broadcast_look_alike() -> None:
    taken = first("u-1", 600)
    assert len(set(taken)) == 600
    for address in taken:
        ip = ipaddress.IPv4Address(address)
        assert ip in POD_ADDRESSES and ip.is_loopback
        assert address.rsplit(".", 1)[1] not in ("0", "255")
    assert ipaddress.IPv4Address("127.0.0.1") not in POD_ADDRESSES
    assert first("u-1", 3) == first("u-1", 3)  # derived from the uid: the same every time
    assert first("u-1") != first("u-2")


def test_a_pod_gets_its_uids_address_and_keeps_it(tmp_path: Path) -> None:
    addresses = PodAddresses(tmp_path / "run", live=lambda _dir: True, bound=set)
    pod = tmp_path / "pods" / "e2e" / "a" / "u-1"
    assert addresses.assign(pod, "u-1") == first("u-1")[0]
    assert (pod / RECORD).read_text().strip() == first("u-1")[0]
    assert addresses.assign(pod, "u-1") == first("u-1")[0]  # recorded: asked again, the same


def test_an_address_a_live_pod_holds_goes_to_no_other_a_stale_one_is_taken_over(tmp_path: Path) -> None:
    live: set[Path] = set()
    addresses = PodAddresses(tmp_path / "run", live=lambda d: d in live, bound=set)
    one, two, three = (tmp_path / "pods" / name for name in ("one", "two", "three"))
    # The same uid hashes to the same first address: a second pod gets the next one.
    held = addresses.assign(one, "same")
    live.add(one)
    assert addresses.assign(two, "same") == first("same", 2)[1] != held
    # A holder with no worker and nothing running (its pod is gone while no runner ran) is stale.
    live.discard(one)
    assert addresses.assign(three, "same") == held


def test_addresses_already_bound_on_the_host_are_skipped(tmp_path: Path) -> None:
    taken = first("u-9", 2)
    addresses = PodAddresses(tmp_path / "run", live=lambda _dir: False, bound=lambda: {taken[0]})
    assert addresses.assign(tmp_path / "pod", "u-9") == taken[1]


def test_a_restarted_runner_keeps_each_pods_address_and_a_gone_pod_frees_it(tmp_path: Path) -> None:
    pod, other = tmp_path / "pods" / "a", tmp_path / "pods" / "b"
    before = PodAddresses(tmp_path / "run", live=lambda _dir: True, bound=set)
    address = before.assign(pod, "same")
    # A new runner process: the pod's record gives its address back, reserved for it again.
    after = PodAddresses(tmp_path / "run", live=lambda d: d == pod, bound=set)
    (tmp_path / "run" / "pod-addresses" / address).unlink()
    assert after.keep(pod) == address
    assert after.assign(other, "same") != address
    assert after.keep(tmp_path / "pods" / "never-had-one") is None  # a pod of an older runner
    after.release(pod)
    assert not (tmp_path / "run" / "pod-addresses" / address).exists()
    assert (pod / RECORD).read_text().strip() == address  # kept with the pod's logs


def test_the_hosts_bound_addresses_are_read_from_proc() -> None:
    table = (
        "  sl  local_address rem_address   st\n"
        "   0: 0100007F:1F90 00000000:0000 0A\n"
        "   1: 0201407F:2100 0100007F:C350 01\n"
    )
    assert _proc_net_addresses(table) == {"127.0.0.1", "127.64.1.2"}
    with socket.create_server(("127.64.200.7", 0)):
        assert "127.64.200.7" in bound_addresses()
