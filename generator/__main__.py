"""`python -m convgen.generator` is the `convgen` command."""

from convgen.generator.cli import main

main()
