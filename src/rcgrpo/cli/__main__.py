"""`python -m rcgrpo.cli` = the `rcgrpo` command."""

from rcgrpo.cli import main

main()
