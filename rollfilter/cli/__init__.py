"""The command line, over the library: nothing else of rollfilter imports it.

- `startup`: what runs before anything is imported (an early Ctrl-C, closed descriptors);
- `main`: the one error boundary, where every outcome becomes an exit status;
- `options`: the typer options, parsed into a `Config` and a `CommandConfig`;
- `collect`: the command's main job, a run (files, writers, signals, the demo agent, the summary);
- `summarize`: --summarize; `outputs`: the files a run writes; `progress`: the live display.

This package's own import is kept light: `startup` runs before typer, trio and httpx load.
"""
