"""Every notebook runs alone, as a learner runs it: its .ipynb copied into an empty folder and
executed top to bottom by nbclient with the project's own interpreter (the python3 kernel of
this environment), offline, with no file of the repository beside it.

Slow (about 15 s a notebook): the notebooks run two at a time in a process pool inside one
module fixture, and each is reported as its own test. `make test` runs them; `-m "not slow"`
leaves them out.
"""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path

import nbformat  # imported here, once: the forked workers share it
import pytest

import book

ROOT = book.ROOT
NOTEBOOKS = [md.with_suffix(".ipynb") for md in book.notebook_sources() if md.with_suffix(".ipynb").exists()]
TIMES = book.TIMES                                   # the last build's times: longest first
TIMEOUT = book.TIMEOUT                               # seconds a cell may run, as in the build
WORKERS = 2                                          # notebooks at a time (a 2-core machine)


def run_alone(path: str) -> tuple[str, float, str | None]:
    """Copy one notebook into an empty folder and execute it there; (name, seconds, error)."""
    _, seconds, error = book.run_alone(path)
    return Path(path).stem, seconds, error


@pytest.fixture(scope="module")
def results(request) -> dict[str, tuple[float, str | None]]:
    """Execute the selected notebooks, WORKERS at a time, longest (by the last build) first."""
    selected = {item.callspec.params["name"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_notebook_runs_alone"}
    previous = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    paths = sorted((p for p in NOTEBOOKS if p.stem in selected),
                   key=lambda p: -previous.get(p.stem, 0.0))
    with concurrent.futures.ProcessPoolExecutor(max_workers=WORKERS) as pool:
        done = {name: (seconds, error)
                for name, seconds, error in pool.map(run_alone, map(str, paths))}
    for name, (seconds, _) in sorted(done.items()):
        print(f"  {name:35s} {seconds:6.1f} s alone")
    return done


def test_there_are_notebooks_to_run():
    assert NOTEBOOKS, "notebooks/ holds no NN_name.ipynb"
    missing = [md.stem for md in book.notebook_sources() if not md.with_suffix(".ipynb").exists()]
    assert not missing, f"no .ipynb beside {missing} (run `make sync`)"


@pytest.mark.slow
@pytest.mark.parametrize("name", [p.stem for p in NOTEBOOKS])
def test_notebook_runs_alone(results, name):
    seconds, error = results[name]
    assert error is None, f"notebooks/{name}.ipynb, run alone in an empty folder, failed " \
                          f"after {seconds:.1f} s:\n{error}"


def test_a_notebook_that_needs_a_file_beside_it_fails_alone(tmp_path):
    """The check can fail: a notebook reading a file of the repository breaks when run alone."""
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    notebook.cells = [nbformat.v4.new_code_cell("x = 1"),
                      nbformat.v4.new_code_cell("open('numbers.toml').read()")]
    path = tmp_path / "99_needs_a_file.ipynb"
    nbformat.write(notebook, path)
    (tmp_path / "numbers.toml").write_text("# beside it, but not copied with it\n")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1) as pool:   # environment kept apart
        name, seconds, error = pool.submit(run_alone, str(path)).result()
    assert name == "99_needs_a_file" and error is not None and "numbers.toml" in error
