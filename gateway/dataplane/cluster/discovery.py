"""DNS discovery of upstream endpoints (like Envoy's STRICT_DNS clusters).

An endpoint given as a name is resolved every ``dns.refresh`` seconds; the
cluster (gateway/dataplane/cluster/cluster.py) keeps one endpoint per address found. This
module only resolves: off the event loop (the system resolver runs in the
loop's executor through ``getaddrinfo``; the nameserver client is async
UDP), bounded by ``dns.timeout``, and never forgetting the last answer on a
failure.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket

from gateway.config.address import Address
from gateway.config.upstreams import DnsDiscovery
from gateway.dataplane.cluster import dnsclient

log = logging.getLogger(__name__)

_FAMILIES = {"v4_only": socket.AF_INET, "v6_only": socket.AF_INET6}


def is_name(host: str) -> bool:
    """Whether ``host`` is a DNS name rather than an IP literal."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False


def _by_family(addresses: list[str], family: str) -> list[str]:
    v4 = [a for a in addresses if ":" not in a]
    v6 = [a for a in addresses if ":" in a]
    if family == "v4_only":
        return v4
    if family == "v6_only":
        return v6
    if family == "v4_preferred":
        return v4 or v6
    return v4 + v6


async def _system(name: str, port: int, family: str) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, family=_FAMILIES.get(family, 0),
                                                         type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


_QUERY_TYPES = {"v4_only": (dnsclient.TYPE_A,), "v6_only": (dnsclient.TYPE_AAAA,)}


async def _nameservers(name: str, dns: DnsDiscovery) -> list[str]:
    servers = tuple((a.host, a.port) for a in dns.nameservers)
    qtypes = _QUERY_TYPES.get(dns.family, (dnsclient.TYPE_A, dnsclient.TYPE_AAAA))
    return await dnsclient.resolve(servers, name, qtypes, dns.timeout)


async def resolve(name: str, port: int, dns: DnsDiscovery) -> list[str]:
    """The addresses of ``name``, sorted, without repeats; raises OSError
    (or DnsError, TimeoutError) when there is no answer or no address."""
    async with asyncio.timeout(dns.timeout):
        found = await (_nameservers(name, dns) if dns.nameservers else _system(name, port, dns.family))
    addresses = sorted(set(_by_family(found, dns.family)))
    if not addresses:
        raise dnsclient.DnsError("no address")
    return addresses


class NameWatch:
    """One endpoint name of an upstream and its last known addresses."""

    def __init__(self, upstream: str, address: Address, dns: DnsDiscovery) -> None:
        self.upstream = upstream
        self.address = address  # the configured name:port
        self.dns = dns
        self.addresses: list[str] = []  # empty until the first answer
        self.failures_total = 0

    def endpoints(self) -> list[Address]:
        return [Address(ip, self.address.port, self.address.host) for ip in self.addresses]

    async def refresh(self) -> bool:
        """Resolve once; False (the last addresses kept, the failure logged
        and counted) when the name could not be resolved."""
        try:
            addresses = await resolve(self.address.host, self.address.port, self.dns)
        except (OSError, TimeoutError, dnsclient.DnsError, UnicodeError) as exc:
            self.failures_total += 1
            log.warning("upstream %s: resolving %s failed (%s); keeping %s", self.upstream, self.address.host,
                        exc or type(exc).__name__, ", ".join(self.addresses) or "the name as one endpoint")
            return False
        if addresses != self.addresses:
            log.info("upstream %s: %s resolves to %s", self.upstream, self.address.host, ", ".join(addresses))
        self.addresses = addresses
        return True
