"""The defaults the command line shows in its --help, in a module that imports nothing: the
options are declared with them (`cli/options.py`) before the command knows whether it will run,
and --help and --version load neither the library's `Config` nor what it imports."""

DEFAULT_CONCURRENCY = 32
DEFAULT_RETRIES = 3
DEFAULT_CONNECT_TIMEOUT = 10.0
# The statuses curl's --retry treats as transient.
DEFAULT_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# Lines longer than this are refused as bad input instead of being held in memory.
DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024
# Retries an agent may receive per row sent to it, beyond the retry budget's reserve.
DEFAULT_RATIO = 0.1
