"""The builds a run measures: this checkout's and, beside it, another (a --guard REV, the
other profile, the build without the standby barrier), each started as toolkit Services."""

from __future__ import annotations

from pathlib import Path

from toolkit.common import free_port
from toolkit.service import Service, cli

# The product's defaults, where the toolkit's Service runs as deployed (warn, no migration
# at start): bench/RESULTS.md was measured with a line logged per request and the schema
# checked at every start.
MEASURED_AS = {"RUST_LOG": "info", "PLANTSTORE_MIGRATE": "true"}


class Build:
    """A plantstore binary and the settings of its own that each of its services gets."""

    def __init__(self, binary: Path, work: Path, settings: dict | None = None):
        self.binary = binary
        self.work = work
        self.settings = {**MEASURED_AS, **(settings or {})}

    def cli(self, url: str, *args: str, timeout=3600) -> str:
        """A command of this build; an older build must not migrate a newer schema either."""
        return cli(self.binary, url, *args, timeout=timeout,
                   PLANTSTORE_MIGRATE=self.settings["PLANTSTORE_MIGRATE"])

    def start(self, name: str, url: str, within: float, **settings) -> Service:
        """A service of this build on `url` and a free port, ready; its log is
        `work/NAME.log`. RuntimeError when it did not get ready within `within` seconds."""
        service = Service(name, self.binary, url, free_port(), self.work,
                          **{**self.settings, **settings})
        if not service.start(within):
            raise RuntimeError(service.not_ready)
        return service
