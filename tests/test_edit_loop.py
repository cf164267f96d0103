"""The fast edit loop of `make book`: what is executed again after which change, what Sphinx reads
again, which generated pages are rewritten. Small crafted notebooks and a small Sphinx project;
no notebook of the book is executed."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import book
import executed_pages

HEADER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---
"""


def notebook(path: Path, prose: str = "Some prose.", code: str = "x = 1") -> Path:
    """A small MyST notebook: a title, a sentence, one code cell."""
    path.write_text(f"{HEADER}\n# A page\n\n{prose}\n\n```{{code-cell}} ipython3\n{code}\n```\n",
                    encoding="utf-8")
    return path


# ── what is stale after which change ──────────────────────────────────────────────────────


@pytest.fixture
def root(tmp_path):
    """A copy of every input the digest reads, to change one at a time."""
    for name in book.INPUT_FILES:
        source = book.ROOT / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("name", ["scripts/tx_part4.py", "requirements.txt",
                                  "requirements-nodeps.txt", "pyproject.toml"])
def test_the_module_or_a_pin_changes_the_inputs(root, name):
    before = book.inputs_digest(root)
    with open(root / name, "a", encoding="utf-8") as file:
        file.write("\n# an edit\n")
    assert book.inputs_digest(root) != before


def test_a_model_config_changes_the_inputs(root):
    before = book.inputs_digest(root)
    config = next((root / "scripts" / "tx_model_configs").glob("*.json"))
    config.write_text(config.read_text(encoding="utf-8").replace("}", ', "x": 1}', 1),
                      encoding="utf-8")
    assert book.inputs_digest(root) != before


def test_a_simulated_machine_changes_the_inputs(root, monkeypatch):
    before = book.inputs_digest(root)
    monkeypatch.setenv("WHY_SELF_ATTENTION_MACHINE", '{"cores": 64}')
    assert book.inputs_digest(root) != before


def test_prose_and_expectations_leave_the_inputs_alone(root):
    """numbers.toml, README and the notebooks' prose change no output."""
    before = book.inputs_digest(root)
    (root / "numbers.toml").write_text("# changed\n", encoding="utf-8")
    (root / "README.md").write_text("# changed\n", encoding="utf-8")
    assert book.inputs_digest(root) == before


@pytest.fixture
def cached(tmp_path):
    """A notebook and a jupyter-cache holding an 'executed' copy of it, made from inputs 'v1'."""
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    md = notebook(tmp_path / "09_page.md")
    cache = get_cache(str(tmp_path / "cache"))
    executed = book.read_md(md, copy=True)
    cache.cache_notebook_bundle(CacheBundleIn(executed, str(md), data={"inputs": "v1"}),
                                check_validity=False)
    return md, cache


def test_an_unchanged_notebook_is_not_executed_again(cached):
    md, cache = cached
    assert book.stale_notebooks(cache, [md], "v1") == []


def test_a_prose_edit_is_not_executed_again(cached):
    md, cache = cached
    notebook(md, prose="Other prose, a whole new paragraph.")
    assert book.stale_notebooks(cache, [md], "v1") == []


def test_a_code_edit_is_executed_again(cached):
    md, cache = cached
    notebook(md, code="x = 2")
    assert book.stale_notebooks(cache, [md], "v1") == [md]


def test_other_inputs_are_executed_again(cached):
    """Same code cells, another module, pin or environment: jupyter-cache alone would match."""
    md, cache = cached
    cache.match_cache_notebook(book.read_md(md))          # jupyter-cache's own key still matches
    assert book.stale_notebooks(cache, [md], "v2") == [md]


def test_a_notebook_never_executed_is_stale(tmp_path):
    from jupyter_cache import get_cache

    md = notebook(tmp_path / "09_page.md")
    assert book.stale_notebooks(get_cache(str(tmp_path / "cache")), [md], "v1") == [md]


def test_the_cache_key_of_jupytext_is_the_key_of_myst_nb(tmp_path):
    """The build finds executed copies with jupytext's parse (read_for_cache); myst-nb renders
    with its own reader: both must give each notebook of the book the same key."""
    from jupyter_cache import get_cache
    from jupyter_cache.readers import get_reader

    cache = get_cache(str(tmp_path / "cache"))
    for md in book.notebook_sources():
        ours = cache.create_hashed_notebook(book.read_for_cache(md))[1]
        theirs = cache.create_hashed_notebook(get_reader(book.READER)(str(md)))[1]
        assert ours == theirs, md.name


@pytest.mark.parametrize("ci,fresh_var,fresh", [
    ("true", None, True), ("", None, False), ("false", None, False),
    ("true", "0", False),            # a pull request's workflow: incremental from its cache
    ("", "1", True), ("false", "1", True), ("true", "", True)])
def test_ci_builds_fresh_unless_fresh_says_otherwise(monkeypatch, ci, fresh_var, fresh):
    monkeypatch.setenv("CI", ci)
    if fresh_var is None:
        monkeypatch.delenv("FRESH", raising=False)
    else:
        monkeypatch.setenv("FRESH", fresh_var)
    assert book.fresh_requested() is fresh
    assert book.fresh_requested(True) is True


def test_the_makefile_passes_fresh():
    """`make book FRESH=1` runs `book.py build --fresh`; `make book` runs it without."""
    def dry(*args):
        done = subprocess.run(["make", "-n", "--always-make", "book", *args], cwd=book.ROOT,
                              capture_output=True, text=True, env={**os.environ, "FRESH": ""})
        return [line for line in done.stdout.splitlines() if "book.py build" in line]
    if shutil.which("make") is None:
        pytest.skip("no make")
    assert dry() and all("--fresh" not in line for line in dry())
    assert any(line.rstrip().endswith("build --fresh") for line in dry("FRESH=1"))


def test_build_passes_fresh_to_execution_and_rendering(monkeypatch, capsys):
    seen = {}

    class Render:                     # book.RenderAlongside, recorded
        def __init__(self, fresh):
            seen["render"] = fresh

        def go(self, order=None):
            seen["go"] = order

        def finish(self):
            seen["finished"] = True

        def stop(self):
            seen["stopped"] = True

    for step in ("check_sync", "write_ledger", "write_exercises", "check_numbers"):
        monkeypatch.setattr(book, step, lambda *args, **kwargs: None)
    monkeypatch.setattr(book, "execute", lambda **kwargs: seen.update(execute=kwargs) or {})
    monkeypatch.setattr(book, "RenderAlongside", Render)
    monkeypatch.setattr(book, "start_warm", lambda: "warm server")
    monkeypatch.setenv("CI", "true")
    book.build()
    assert seen["execute"]["fresh"] is True and seen["render"] is True and seen["finished"]
    assert seen["execute"]["warm"] == "warm server"
    # a fresh build's Sphinx is told to go once the notebooks are about to run
    assert seen["execute"]["render"](["01_a"]) is not None and seen["go"] == ["01_a"]
    seen.clear()
    monkeypatch.setenv("CI", "")
    book.build()
    assert seen["execute"]["fresh"] is False and seen["render"] is False and seen["finished"]
    assert seen["execute"]["render"] is None and seen["execute"]["warm"] is None


def test_a_failed_build_stops_its_render(monkeypatch):
    seen = {}

    class Render:
        def __init__(self, fresh):
            pass

        def stop(self):
            seen["stopped"] = True

    def failing(**kwargs):
        raise book.BuildError("a notebook failed to execute")

    monkeypatch.setattr(book, "check_sync", lambda: None)
    monkeypatch.setattr(book, "execute", failing)
    monkeypatch.setattr(book, "RenderAlongside", Render)
    monkeypatch.setenv("CI", "")
    with pytest.raises(book.BuildError):
        book.build()
    assert seen == {"stopped": True}


# ── generated pages: written only when their text changes ─────────────────────────────────


def test_a_generated_page_is_written_only_when_its_text_changes(tmp_path):
    page = tmp_path / "ledger.md"
    assert book.write_if_changed(page, "# The ledger\n") == "written"
    stamp = page.stat().st_mtime_ns
    time.sleep(0.01)
    assert book.write_if_changed(page, "# The ledger\n") == "unchanged"
    assert page.stat().st_mtime_ns == stamp
    assert book.write_if_changed(page, "# The ledger, again\n") == "written"


# ── what Sphinx reads again ───────────────────────────────────────────────────────────────


def test_pages_depend_on_the_stamps_of_what_they_show(tmp_path):
    for stem in ("01_costs", "02_steps"):
        (tmp_path / stem).write_text("now\n")
    deps = lambda docname, text: [p.name for p in executed_pages.stamps_for(  # noqa: E731
        docname, text, tmp_path)]
    assert deps("notebooks/01_costs", "# Part 1") == ["01_costs"]
    assert deps("notebooks/03_never_run", "# Part 3") == []          # no stamp: no dependency
    assert deps("book/scorecard", "{glue:text}`../notebooks/02_steps.md::depth_27:,` and "
                "{glue}`notebooks/01_costs::n`") == ["01_costs", "02_steps"]
    assert deps("book/execution", "```{nb-exec-table}\n```") == ["01_costs", "02_steps"]
    assert deps("book/intro", "Plain prose, a `code::span`.") == []


def sphinx_build(src: Path, out: Path) -> str:
    """Build a small Sphinx project once (in this process); its status log."""
    from sphinx.application import Sphinx

    status = io.StringIO()
    app = Sphinx(str(src), str(src), str(out / "html"), str(out / "doctrees"), "html",
                 status=status, warning=io.StringIO(), freshenv=False)
    app.build()
    return status.getvalue()


def test_sphinx_reads_a_page_again_when_its_notebook_ran_again(tmp_path, monkeypatch):
    """The .md is unchanged; only its stamp is newer: Sphinx reads the page, and the page that
    pastes from it, again; the others not."""
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    monkeypatch.setattr(executed_pages, "stamps_folder", lambda: stamps)
    src = tmp_path / "src"
    (src / "notebooks").mkdir(parents=True)
    (src / "conf.py").write_text(f"import sys\nsys.path.insert(0, {str(book.ROOT / 'scripts')!r})\n"
                                 "extensions = ['executed_pages']\n", encoding="utf-8")
    (src / "index.rst").write_text("Index\n=====\n\n.. toctree::\n\n   notebooks/01_a\n   "
                                   "scorecard\n   other\n", encoding="utf-8")
    (src / "notebooks" / "01_a.rst").write_text("A\n=\n\nText.\n", encoding="utf-8")
    (src / "scorecard.rst").write_text("Score\n=====\n\nPastes {glue:text}`notebooks/01_a::k`.\n",
                                       encoding="utf-8")
    (src / "other.rst").write_text("Other\n=====\n\nText.\n", encoding="utf-8")
    (stamps / "01_a").write_text("first run\n")
    out = tmp_path / "out"
    assert "4 added" in sphinx_build(src, out)
    assert "0 added, 0 changed" in sphinx_build(src, out)          # nothing ran: nothing read
    time.sleep(0.01)
    (stamps / "01_a").write_text("ran again\n")
    log = sphinx_build(src, out)
    assert "0 added, 2 changed" in log, log                       # the page and the scorecard
    assert "0 added, 0 changed" in sphinx_build(src, out)


# ── the kernels: no transport warning ─────────────────────────────────────────────────────


def test_kernels_start_without_a_transport_warning(tmp_path):
    """ipykernel 7.3+ warns on stderr when a kernel talks plain TCP: the build's kernels are
    encrypted. The kernel writes to the stderr of the process that started it."""
    md = notebook(tmp_path / "09_page.md", code="print(6 * 7)")
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import book; "
              "_, _, error, nb = book._execute_one(sys.argv[2]); "
              "assert error is None, error; print(nb.cells[-1].outputs[0].text)")
    done = subprocess.run([sys.executable, "-c", script, str(book.ROOT / "scripts"), str(md)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "42"
    assert "without encryption" not in done.stderr, done.stderr
    assert "WARNING" not in done.stderr, done.stderr


def test_the_kernel_config_asks_for_encryption():
    from jupyter_client.manager import KernelManager

    manager = book.kernel_manager("python3")
    if "transport_encryption" in KernelManager.class_traits():
        assert manager.transport_encryption == "auto"


def test_sync_leaves_unchanged_pairs_alone(tmp_path, monkeypatch):
    """`make sync` writes only what changes: Sphinx reads a page again when its file is newer,
    so an untouched .md keeps its time (one prose edit re-reads one page, not eight)."""
    md = book.notebook_sources()[0]
    for path in (md, md.with_suffix(".ipynb")):
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.setattr(book, "NOTEBOOKS", tmp_path)
    monkeypatch.setattr(book, "sync_saved", lambda *args, **kwargs: None)
    book.sync()
    times = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    time.sleep(0.01)
    book.sync()
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == times


def test_pybtex_finds_the_same_plugins_once_registered():
    """scripts/bibtex_plugins.py registers every installed pybtex plugin at run time: each
    lookup the citations make returns the class the entry points name."""
    from importlib.metadata import entry_points

    import pybtex.plugin

    import bibtex_plugins

    assert bibtex_plugins.register_installed_plugins() > 0
    for group, name in (("pybtex.backends", "plaintext"), ("pybtex.style.formatting", "alpha"),
                        ("pybtex.style.formatting", "plain"), ("pybtex.style.labels", "alpha")):
        (entry,) = entry_points(group=group, name=name)
        assert pybtex.plugin.find_plugin(group, name) is entry.load()
    assert pybtex.plugin.find_plugin("pybtex.style.names") is \
        pybtex.plugin.find_plugin("pybtex.style.names", "plain")


def test_a_failed_render_reads_every_page_next_time(tmp_path, monkeypatch):
    """Sphinx warns about a page only while it reads it: after a failed render the next build
    must read every page again, or it would pass on the page that warned."""
    doctrees = tmp_path / ".doctrees"
    doctrees.mkdir()
    (doctrees / "environment.pickle").write_bytes(b"pickled")
    monkeypatch.setattr(book, "BUILD", tmp_path)
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="notebooks/01.md: WARNING: x")
    monkeypatch.setattr(book.subprocess, "run", lambda *args, **kwargs: failed)
    with pytest.raises(book.BuildError, match="WARNING: x"):
        book.html()
    assert not (doctrees / "environment.pickle").exists()
