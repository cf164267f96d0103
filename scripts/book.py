"""The build's command line; the make targets call it.

  python scripts/book.py build [--fresh]     everything `make book` does
  python scripts/book.py check-sync | sync | ledger | html | pdf
  python scripts/book.py execute [--fresh] | check-numbers | numbers [PAGE…]
  python scripts/book.py compat [lowest | colab] | newest

The stages are scripts/bookbuild/'s modules, each importing only those
before it: common, pairs, execute, numbers, ledger, site, then pdf, compat
and newest. A failure exits 1 naming the notebook, the cell or the key.
"""

import sys
import time


def build(fresh: bool = False) -> None:
    """Pairs, execution of what is stale, the generated pages, the site,
    the number check over every page."""
    from bookbuild import execute, ledger, numbers, pairs, site

    start = time.perf_counter()
    pairs.check_sync()
    ledger.write_exercises()
    execute.execute(fresh=fresh)
    glued = execute.glued_values()
    ledger.write_ledger(glued)
    site.render("html", fresh)
    numbers.check_numbers(glued=glued)
    print(f"make book: {time.perf_counter() - start:.1f} s in all")


def main(argv: list[str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("build", [])
    if command in ("compat", "newest"):       # their own environments
        from importlib import import_module

        return import_module(f"bookbuild.{command}").main(args)
    from bookbuild import execute, ledger, numbers, pairs, pdf, site
    from bookbuild.common import BuildError

    pages = [a for a in args if not a.startswith("-")] or None
    fresh = "--fresh" in args
    commands = {
        "build": lambda: build(fresh),
        "check-sync": pairs.check_sync, "sync": pairs.sync,
        "execute": lambda: execute.execute(pages, fresh),
        "check-numbers": lambda: numbers.check_numbers(pages),
        "numbers": lambda: numbers.accept_numbers(pages),
        "ledger": ledger.write_ledger,
        "html": lambda: site.render("html", fresh), "pdf": pdf.make_pdf}
    if command not in commands:
        print(__doc__)
        return 0 if command in ("-h", "--help") else 2
    try:
        commands[command]()
    except BuildError as error:
        print(f"\nmake book FAILED ({command}): {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
