from rollfilter.cli import main

main()
