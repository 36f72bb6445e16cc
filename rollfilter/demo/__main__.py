"""`python -m rollfilter.demo`."""

from rollfilter.demo.command_line import main

main()
