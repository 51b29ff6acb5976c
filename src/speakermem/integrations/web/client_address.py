"""Who is signing in: the address the login limit is kept by.

Behind a TLS proxy every request comes from the proxy, so keying the limit by the socket's
peer lets one client's bad attempts lock everyone out. The proxy's X-Forwarded-For names the
client, but any client can send that header too: it is read only when the peer is one of
SPEAKERMEM_WEB_TRUSTED_PROXIES, walking it from the right past the trusted hops (each proxy
appends the address it saw), so the first untrusted address is the client.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(values: Iterable[str]) -> tuple[Network, ...]:
    """Addresses or CIDR networks (`10.0.0.5`, `172.16.0.0/12`, `::1`); ValueError names a
    bad one."""
    out: list[Network] = []
    for value in values:
        text = value.strip()
        if not text:
            continue
        try:
            out.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise ValueError(f"{text!r} is not an IP address or network") from None
    return tuple(out)


def _trusted(address: str, trusted: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return False
    return any(ip in net for net in trusted)


def client_address(
    peer: str | None, forwarded_for: Sequence[str], trusted: Sequence[Network]
) -> str:
    """The client's address: the peer, or, when the peer is a trusted proxy, the rightmost
    untrusted address of X-Forwarded-For (all its headers, in order)."""
    client = peer or "unknown"
    if not trusted or not _trusted(client, trusted):
        return client
    hops = [h.strip() for header in forwarded_for for h in header.split(",") if h.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, trusted):
            return hop
        client = hop
    return client
