#!/usr/bin/env python3
"""Plant Store benchmark driver (Python 3.11, stdlib only). Start it through bench/run.

One run measures everything it reports: the service (SQLite and PostgreSQL) under wrk, the raw
database anchors (sqlite-raw, pgbench) and an HTTP ceiling (nginx), all on this machine, now.
See bench/README.md. Figures from different runs must never be compared. The harness itself is
the package bench/harness/, one module per concern; its run from start to end is harness/main.py.
It starts the service with tests/toolkit/, the toolkit the deploy tests use.
"""

import sys
from pathlib import Path

# The checkout stays as the run found it: no __pycache__ folder appears beside the packages.
sys.dont_write_bytecode = True
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from harness.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
