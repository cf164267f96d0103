"""The build, one module a stage (see scripts/book.py)."""
