"""``python -m gateway`` with the test-only ``echo`` upstream protocol added.

Run with ``tests`` on PYTHONPATH: ``python -m peers.echo_gateway serve ...``.
"""

from __future__ import annotations

import sys

from gateway.cli import main
from gateway.protocols import registry

registry.BACKENDS["echo"] = "peers.echo_upstream:EchoClient"

if __name__ == "__main__":
    sys.exit(main())
