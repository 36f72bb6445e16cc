"""Experiment trackers: MLflow and Weights & Biases, fed a run's figures while it goes and when it ends.

The trackers count nothing. `rollfilter.run.tracking` renders the run's snapshot (`RunStatistics`)
into points and its summary into final figures (`flattened`), and hands them to a `TrackerLog`
(`log.py`), whose thread talks to each tracker's client (`to_mlflow.py`, `to_wandb.py`) off the
run's path. A client is imported only by a run that names its tracker, in a thread, before the run
sends (an import beside a busy run costs its rows): a run without one never loads it.
`reservoir.py` keeps the uniform sample of result lines a tracker run shows, `ids.py` the file
that lets a resumed run continue the same tracker runs.
"""
