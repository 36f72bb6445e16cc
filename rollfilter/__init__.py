"""rollfilter: collect agent rollouts as a streaming Unix filter (JSONL in, results out)."""

__version__ = "0.1.0"
