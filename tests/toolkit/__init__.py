"""The Python toolkit of tests/deploy/ and bench/: the service started, stopped and measured
(service.py), the processes a script starts (processes.py), a pg_auto_failover formation
(pg_auto_failover.py), and what every script needs (common.py). Standard library only.

Both sides import it the same way, with tests/ on the path:

    sys.path.insert(0, str(ROOT / "tests"))
    from toolkit.service import Service
"""
