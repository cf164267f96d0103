"""The book's build: `make book` and the other make targets call this.

    python scripts/book.py build        everything `make book` does
                                        (--fresh: execute every notebook)
    python scripts/book.py check-sync   the pairs, #@save and the code width
    python scripts/book.py sync         rewrite the .ipynb pairs and the
                                        module's saved blocks from the .md
    python scripts/book.py execute      execute the stale notebooks
    python scripts/book.py check-numbers | numbers | ledger | html
    python scripts/book.py pdf | compat ... | newest ...

The stages live in scripts/bookbuild/, one module each, importing only the
stages before them: common, pairs, execute, numbers, ledger, site, then pdf,
compat and newest. Every failure exits 1 with a message that names the
notebook, the cell or the key.
"""

from __future__ import annotations

import sys
import time


def build(fresh: bool = False) -> None:
    """Everything `make book` does: pairs, execution of what is stale, the
    generated pages, the site, the number check over every page."""
    from bookbuild import execute, ledger, numbers, pairs, site

    start = time.perf_counter()
    pairs.check_sync()
    ledger.write_exercises()
    execute.execute(fresh=fresh)
    glued = execute.glued_values()
    ledger.write_ledger(glued)
    site.html(fresh=fresh)
    numbers.check_numbers(glued=glued)
    print(f"make book: {time.perf_counter() - start:.1f} s in all")


def main(argv: list[str] | None = None) -> int:
    """Run one command; print a clear message and return 1 on a failure."""
    argv = sys.argv[1:] if argv is None else argv
    command, args = (argv[0], argv[1:]) if argv else ("build", [])
    if command in ("compat", "newest"):       # their own options
        from importlib import import_module

        return import_module(f"bookbuild.{command}").main(args)
    from bookbuild import execute, ledger, numbers, pairs, pdf, site
    from bookbuild.common import BuildError

    pages = [a for a in args if not a.startswith("-")]
    fresh = "--fresh" in args
    commands = {
        "build": lambda: build(fresh),
        "check-sync": pairs.check_sync, "sync": pairs.sync,
        "execute": lambda: execute.execute(pages or None, fresh),
        "check-numbers": lambda: numbers.check_numbers(pages or None),
        "numbers": lambda: numbers.accept_numbers(pages or None),
        "ledger": ledger.write_ledger, "exercises": ledger.write_exercises,
        "html": lambda: site.html(fresh), "pdf": pdf.make_pdf}
    if command not in commands or command in ("-h", "--help"):
        print(__doc__)
        return 0 if command in ("-h", "--help") else 2
    try:
        commands[command]()
    except BuildError as error:
        print(f"\nmake book FAILED ({command}): {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
