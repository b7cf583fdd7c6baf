"""`python -m ledgermq.cli`: the same command line as the `ledgermq` script."""

from ledgermq.cli import main

main()
