"""`python -m headcount ...` (what `torchrun -m headcount ...` runs) = the `headcount` command."""

from headcount.cli import main

if __name__ == "__main__":
    main()
