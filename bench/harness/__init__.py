"""The benchmark harness behind bench/run, one module a concern; bench/soak.py,
bench/retention.py and bench/soak_faults.py borrow from it. It starts the service with
tests/toolkit/, which its scripts put on the path beside bench/."""
