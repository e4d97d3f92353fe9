"""The benchmark harness behind bench/run (bench/soak.py borrows from it), one module a concern."""
