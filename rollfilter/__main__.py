"""`python -m rollfilter`: the command (`rollfilter.cli`)."""

from rollfilter.cli.startup import main

if __name__ == "__main__":
    main()
