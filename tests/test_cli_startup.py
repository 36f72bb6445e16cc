"""cli/startup.py: what the command does before its modules are imported."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import SUBPROCESS_TIMEOUT, clean_env, rows_jsonl, simple_rows

# Each module the command imports, as it imports it, on a line of the file argv[1].
IMPORTS_LOGGED = """
import sys
log = open(sys.argv[1], "w", buffering=1)
sys.addaudithook(lambda event, args: event == "import" and log.write(args[0] + "\\n"))
sys.argv[:2] = ["rollfilter"]
from rollfilter.cli.startup import main
main()
"""


def test_a_run_imports_neither_httpxs_command_line_nor_yaml(tmp_path):
    log = tmp_path / "imports"
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTS_LOGGED, str(log), "--demo", "-q"],
        input=rows_jsonl(simple_rows(2)).encode(),
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 2
    imported = set(log.read_text().split())
    assert {"trio", "httpx", "msgspec", "typer"} <= imported  # the run's own
    # httpx tries to import its command line (which imports rich and pygments), and is refused;
    # yaml is for --prices FILE
    assert "httpx._main" in imported
    assert imported.isdisjoint({"rich", "pygments", "yaml"}), imported & {"rich", "pygments", "yaml"}
