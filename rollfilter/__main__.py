"""`python -m rollfilter`: the command line, as the `rollfilter` command runs it."""

from rollfilter.cli import main

main()
