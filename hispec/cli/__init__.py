"""`python -m hispec`: parsers (shared options defined once) and commands."""
