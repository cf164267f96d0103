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
    from bookbuild.common import BuildError, notebook_sources

    pages = [a for a in args if not a.startswith("-")] or None
    known = {p.stem for p in notebook_sources()}
    if unknown := sorted(set(pages or []) - known):
        print(f"book.py {command}: no notebook {', '.join(unknown)} "
              f"(PAGES takes {', '.join(sorted(known))})", file=sys.stderr)
        return 2
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
        if command in ("-h", "--help"):
            return 0
        print(f"book.py: no command {command!r}", file=sys.stderr)
        return 2
    try:
        commands[command]()
    except BuildError as error:
        print(f"\nmake book FAILED ({command}): {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
