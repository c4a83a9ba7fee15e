"""Bytes through a network interface (/proc/net/dev), the network tiers' equivalent of the block device
counters: the interface that carries the traffic to a server is found from the routing table
(/proc/net/route; a loopback address is ``lo``), and its received and sent bytes are read before and after
the run phase."""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass

__all__ = ["NetCounter", "interface_for"]

LOOPBACK = "lo"


def _routes(path: str = "/proc/net/route") -> list[tuple[str, int, int]]:
    """(interface, destination, mask) of each IPv4 route, addresses as host-order integers."""
    out = []
    try:
        with open(path, encoding="ascii") as fh:
            next(fh, None)
            for line in fh:
                f = line.split()
                if len(f) >= 8:
                    dest = struct.unpack("<I", bytes.fromhex(f[1]))[0]
                    mask = struct.unpack("<I", bytes.fromhex(f[7]))[0]
                    out.append((f[0], socket.ntohl(dest), socket.ntohl(mask)))
    except (OSError, ValueError):
        pass
    return out


def interface_for(host: str) -> str | None:
    """The interface traffic to `host` leaves by (None: unknown, e.g. IPv6 without a route table entry)."""
    try:
        addr = ipaddress.ip_address(socket.gethostbyname(host))
    except (OSError, ValueError):
        return None
    if addr.is_loopback:
        return LOOPBACK
    ip = int(addr)
    best = max((r for r in _routes() if ip & r[2] == r[1]), key=lambda r: bin(r[2]).count("1"), default=None)
    return best[0] if best is not None else None


@dataclass(frozen=True)
class NetCounter:
    """The byte counters of one interface."""

    name: str

    def snapshot(self) -> tuple[int, int] | None:
        """(received bytes, sent bytes) now; None if the interface is not listed."""
        try:
            with open("/proc/net/dev", encoding="ascii") as fh:
                for line in fh:
                    name, sep, rest = line.partition(":")
                    if sep and name.strip() == self.name:
                        f = rest.split()
                        return int(f[0]), int(f[8])
        except (OSError, ValueError, IndexError):
            return None
        return None

    @classmethod
    def for_host(cls, host: str | None) -> NetCounter | None:
        name = interface_for(host) if host else None
        return cls(name) if name else None
