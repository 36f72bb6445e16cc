"""Example rows: NeMo Gym's five-row weather example (weather.jsonl)."""
