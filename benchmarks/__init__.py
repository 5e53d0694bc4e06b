"""SpotWarp's benchmarks: `python -m benchmarks NAME` runs one and keeps its figures (see __main__.py)."""
