"""`jupyter-book` with its arguments, and an exit that skips Python's teardown.

After a render, the `jupyter-book` process holds every page's document tree, the environment and
the libraries that made them; Python then spends about 0.9 s freeing them one by one before the
process ends, on every build, a prose edit's included. The operating system frees a process's
memory at once: this runs jupyter-book's own command line, flushes what it printed, and ends the
process with `os._exit` and jupyter-book's exit code.

    python scripts/render.py build . --builder html ...     (as `jupyter-book build ...`)
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    """Run jupyter-book's command line on `argv`; its exit code."""
    import click
    from jupyter_book.cli.main import main as jupyter_book

    try:
        jupyter_book.main(argv, prog_name="jupyter-book", standalone_mode=False)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.ClickException as error:
        error.show()
        return error.exit_code
    except click.exceptions.Abort:
        print("Aborted!", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
