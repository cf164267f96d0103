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

BUDGET_NOTEBOOK = 20.0     # seconds one notebook should take (a warning)
# seconds a fresh `make book` should take: twice the floor (the notebooks'
# code as plain scripts, two at a time: 19.7 s on the book's 2-core machine)
BUDGET_BUILD = 40.0


def budget_report(times: dict[str, float], total: float,
                  fresh: bool = True) -> list[str]:
    """The build's closing lines: each notebook executed and the total,
    against the budget. Over budget is a WARNING line, never a failure."""
    def over(seconds: float, budget: float) -> str:
        return "  OVER BUDGET" if seconds >= budget else ""

    lines = [f"build times (budget: each notebook < {BUDGET_NOTEBOOK:g} s, "
             f"a fresh build < {BUDGET_BUILD:g} s):"]
    lines += [f"  {stem:35s} {s:6.1f} s{over(s, BUDGET_NOTEBOOK)}"
              for stem, s in sorted(times.items())]
    whole = ("whole build" if fresh
             else f"whole build ({len(times)} executed)")
    lines.append(f"  {whole:35s} {total:6.1f} s"
                 + (over(total, BUDGET_BUILD) if fresh else ""))
    lines += [f"WARNING: notebooks/{stem}.md took {s:.1f} s, over the "
              f"budget of {BUDGET_NOTEBOOK:g} s for one notebook"
              for stem, s in sorted(times.items()) if s >= BUDGET_NOTEBOOK]
    if fresh and total >= BUDGET_BUILD:
        lines.append(f"WARNING: the build took {total:.1f} s, over its "
                     f"budget of {BUDGET_BUILD:g} s")
    return lines


def build(fresh: bool = False) -> None:
    """Everything `make book` does: pairs, execution of what is stale, the
    generated pages, the site, the number check over every page."""
    from bookbuild import execute, ledger, numbers, pairs, site

    start = time.perf_counter()
    fresh = execute.fresh_requested(fresh)
    pairs.check_sync()
    ledger.write_exercises()
    times = execute.execute(fresh=fresh)
    glued = execute.glued_values()
    ledger.write_ledger(glued)
    site.html(fresh=fresh)
    numbers.check_numbers(glued=glued)
    for line in numbers.claims_near_threshold(glued):
        print(line)
    total = time.perf_counter() - start
    print("\n".join(budget_report(times, total, fresh)))
    print(f"make book: {total:.1f} s in all")


def main(argv: list[str] | None = None) -> int:
    """Run one command; print a clear message and return 1 on a failure."""
    argv = sys.argv[1:] if argv is None else argv
    command, args = (argv[0], argv[1:]) if argv else ("build", [])
    if command in ("compat", "newest", "pdf"):       # their own options
        from importlib import import_module

        return import_module(f"bookbuild.{command}").main(args)
    from bookbuild import execute, ledger, numbers, pairs, site
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
        "html": lambda: site.html(fresh)}
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
