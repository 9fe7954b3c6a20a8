"""The product benchmarks (`make bench`, `make bench TARGET=cuda`, `make bench-memory`), run from the
repository root as modules: `python -m benchmarks.bench --spec ...`."""
