"""`python -m polar.cli …` (subprocess tests, the benchmarks)."""

from polar.cli import main

main()
