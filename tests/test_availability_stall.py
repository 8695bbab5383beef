"""The stall test: while three clients each send the worst body the
default limits admit, every listener's health probe and a small infer on
another connection are answered promptly, and memory stays bounded; on
both HTTP servers (the fast path, and aiohttp alone).

The recipe (tests/peers/stall_attack.py) is the one docs/security.md quotes;
``python -m peers.stall_attack`` prints the same figures for a longer run.
"""

from __future__ import annotations

import pytest

from peers.stall_attack import ATTACKS, CONFIG, MAX_BOUND, MEDIAN_BOUND, machine_slowdown, run_attack
from support import GatewayProcess, write_config

# The bound on RSS growth (the probes': the recipe's MEDIAN_BOUND and MAX_BOUND).
RSS_BOUND = 1 << 30


def classic(config: str) -> str:
    """The config with the HTTP listeners' fast path off: every request on
    the aiohttp server, the path the fast one hands unusual requests to."""
    return "\n".join(line[:line.rindex("}")] + ", fast_path: false}"
                     if "address:" in line and "protocol:" in line and "v2-grpc" not in line else line
                     for line in config.splitlines())


# Both HTTP servers: the fast path (the default) and aiohttp alone.
@pytest.fixture(scope="module", params=["fast-path", "aiohttp"])
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> GatewayProcess:
    directory = tmp_path_factory.mktemp("stall")
    config = CONFIG if request.param == "fast-path" else classic(CONFIG)
    assert config.count("fast_path: false") == (0 if request.param == "fast-path" else 4)
    with GatewayProcess(write_config(directory, config), directory / "gateway.log") as gw:
        yield gw


@pytest.mark.parametrize("attack", ATTACKS)
def test_probes_stay_fast_under_attack(gateway: GatewayProcess, attack: str) -> None:
    assert gateway.proc is not None
    slowdown = machine_slowdown()
    result = run_attack(gateway.ports, gateway.proc.pid, [attack] * 3, seconds=4.0)
    report = f"{result.report()}\n  median bound {MEDIAN_BOUND * slowdown * 1000:.0f} ms (machine {slowdown:.2f}x)"
    answered = sum(tally["200"] for tally in result.attacks.values())
    assert answered > 0, f"no attack body was served: the test would prove nothing\n{report}"
    for probe in result.probes.values():
        median, worst = probe.figures()
        assert probe.failures == 0, report
        assert median <= MEDIAN_BOUND * slowdown, report
        assert worst <= MAX_BOUND, report
    assert result.rss_growth <= RSS_BOUND, report
    assert gateway.proc.poll() is None, report
