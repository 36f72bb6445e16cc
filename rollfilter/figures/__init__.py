"""The figures of a run's results: pass@k, error bars, exact sums, two runs compared."""
