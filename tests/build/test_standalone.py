"""Every notebook runs alone, as a learner runs it: top to bottom, in an
empty folder, offline, with this project's kernel.

That run is the build's own (bookbuild/execute.py runs each notebook in an
empty temporary folder, from the .md whose cells the .ipynb pair holds),
so this test runs the stale notebooks through it, into the cache the book
renders from: `make book` after `make test` executes nothing again, and no
notebook runs twice in one CI run. Slow: `-m "not slow"` leaves it out.
"""

from __future__ import annotations

import pytest

from bookbuild import common, execute, pairs


def test_there_are_notebooks_and_their_pairs():
    sources = common.notebook_sources()
    assert sources, "notebooks/ holds no NN_name.md"
    missing = [md.stem for md in sources
               if not md.with_suffix(".ipynb").exists()]
    assert not missing, f"no .ipynb beside {missing} (run `make sync`)"


@pytest.mark.slow
def test_every_notebook_runs_alone_in_an_empty_folder():
    pairs.check_sync()          # the .ipynb a learner opens has these cells
    try:
        execute.execute()
    except common.BuildError as error:
        pytest.fail(str(error), pytrace=False)
    assert execute.stale(execute.open_cache(), common.notebook_sources()) \
        == []
