"""The book's mechanics: glue from a real kernel, plain values, the pairs, the command line."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import tx_part4 as tx
from bookbuild import common, execute, pairs


@pytest.mark.parametrize("value,expected,kind", [
    (np.int64(7), 7, int), (np.float32(0.5), 0.5, float), (torch.tensor(3), 3, int),
    (np.bool_(True), True, bool), (True, True, bool), ("text", "text", str),
])
def test_plain_gives_python_values(value, expected, kind):
    assert tx.plain(value) == expected and type(tx.plain(value)) is kind


def test_show_prints_the_value_outside_a_notebook(capsys):
    assert tx.show("answer", np.int64(12288)) == 12288
    assert capsys.readouterr().out.strip() == "answer = 12,288"


def test_show_glues_in_a_real_kernel_with_its_kind(run_alone, tmp_path):
    """Execute a two-cell notebook and read the glue back the way the number check does."""
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(
        "import numpy as np, tx_part4 as tx\n"
        "tx.show('count', np.int64(746496))\n"
        "tx.show('wall_ms', 1.5, kind='measured')\n"
        "import pandas as pd\n"
        "tx.show_table('t', pd.DataFrame({'a': [1, 2]}, index=[10, 20]))\n"
        "tx.claim('wins', 4.0, 1.5)\n"
        "tx.phrase('words', True, 'faster than', 'slower than')")]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, tmp_path / "glue.ipynb")
    found = execute.glued_in_notebook(run_alone(tmp_path / "glue.ipynb"))
    assert found["count"].value == 746496 and found["count"].kind == "exact"
    assert found["wall_ms"].value == 1.5 and found["wall_ms"].kind == "measured"
    assert found["t.10.a"].value == 1 and found["t.20.a"].value == 2
    # a claim's ratio and threshold, a phrase's words: glued beside them
    assert (found["wins"].value, found["wins"].margin) == (True, 4.0 / 1.5)
    assert found["words"].values == ["faster than", "slower than"]
    assert not [key for key in found if key.startswith(execute.HINT)]


def test_the_committed_pairs_are_in_sync():
    pairs.check_sync()


def test_an_ipynb_with_outputs_fails_the_pair_check(tmp_path, monkeypatch):
    import nbformat

    for md in common.notebook_sources()[:1]:
        (tmp_path / md.name).write_text(md.read_text(encoding="utf-8"), encoding="utf-8")
        notebook = nbformat.reads(pairs.ipynb_text(md), as_version=4)
        code = next(c for c in notebook.cells if c.cell_type == "code")
        code.outputs = [nbformat.v4.new_output("stream", text="hello")]
        (tmp_path / md.with_suffix(".ipynb").name).write_text(nbformat.writes(notebook), encoding="utf-8")
    monkeypatch.setattr(common, "NOTEBOOKS", tmp_path)
    with pytest.raises(common.BuildError, match="carries outputs"):
        pairs.check_sync()


def test_a_stale_ipynb_fails_the_pair_check(tmp_path, monkeypatch):
    md = common.notebook_sources()[0]
    (tmp_path / md.name).write_text(md.read_text(encoding="utf-8") + "\nA new line.\n", encoding="utf-8")
    (tmp_path / md.with_suffix(".ipynb").name).write_text(
        md.with_suffix(".ipynb").read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(common, "NOTEBOOKS", tmp_path)
    with pytest.raises(common.BuildError, match="differs from its .md"):
        pairs.check_sync()


def test_the_colab_cell_names_the_configured_repository():
    assert common.repository_url() in pairs.colab_cell()
    for md in common.notebook_sources():
        cell = pairs.first_code_cell(common.read_md(md))
        assert cell.source.strip() == pairs.colab_cell().strip(), md.name


def test_the_command_line_prints_every_table():
    done = subprocess.run([sys.executable, str(common.ROOT / "scripts" / "tx_part4.py")],
                          capture_output=True, text=True, check=True)
    printed = " ".join(done.stdout.split())           # titles wrap at 76
    for title, _ in tx.TABLES:
        assert title in printed
    assert f"{8192 * 8192 * 512:,}" in done.stdout      # n²d at n = 8,192, d = 512
    assert all(len(line) <= tx.WIDTH for line in done.stdout.splitlines())


def test_figures_reach_the_page_even_when_the_environment_says_agg(run_alone, tmp_path, monkeypatch):
    """A kernel that inherits MPLBACKEND=Agg draws nothing: the build must still get the PNG."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    page = tmp_path / "99_figure.md"
    header = common.NOTEBOOKS.joinpath("01_costs.md").read_text(encoding="utf-8").split("---", 2)[1]
    page.write_text(f"---{header}---\n\n```{{code-cell}} ipython3\nimport matplotlib.pyplot as plt\n"
                    "plt.plot([1, 2])\nplt.show()\n```\n", encoding="utf-8")
    notebook = run_alone(page, {"WHY_SELF_ATTENTION_PROBE": "1"})
    outputs = [o for cell in notebook.cells for o in cell.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    # set only while the kernels run: this process's is as it was (a later stamp reads it)
    assert os.environ["MPLBACKEND"] == "Agg"
    assert "WHY_SELF_ATTENTION_PROBE" not in os.environ


def test_a_saved_function_edited_without_sync_fails_showing_the_line(tmp_path, monkeypatch):
    """A reader edits a #@save cell in a notebook and does not run `make sync`: the pair check
    fails and shows the first line whose two copies differ."""
    md = common.NOTEBOOKS / "01_costs.md"
    saved = pairs.saved_cells(md)
    assert any("def attention_core(" in cell for cell in saved), "Part 1 saves attention_core"
    text = md.read_text(encoding="utf-8")
    edited = text.replace("weights = torch.softmax(scores, dim=-1)", "weights = torch.softmax(scores * 2, dim=-1)")
    assert edited != text
    for other in common.notebook_sources():
        (tmp_path / other.name).write_text(other.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / md.name).write_text(edited, encoding="utf-8")
    monkeypatch.setattr(common, "NOTEBOOKS", tmp_path)
    with pytest.raises(common.BuildError, match=r"01_costs.md and scripts/tx_part4.py disagree: .*softmax\(scores"):
        pairs.check_saved()


def test_sync_writes_the_edit_into_the_module(tmp_path, monkeypatch):
    """`make sync` carries an edited saved cell into the module, and the check then passes."""
    for other in common.notebook_sources():                  # every page: the module has their blocks
        (tmp_path / other.name).write_text(other.read_text(encoding="utf-8"), encoding="utf-8")
    md = tmp_path / "01_costs.md"
    md.write_text(md.read_text(encoding="utf-8").replace(
        "# hidden pairs get weight 0", "# hidden pairs get no weight"), encoding="utf-8")
    module = tmp_path / "tx_part4.py"
    module.write_text(common.MODULE.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(common, "NOTEBOOKS", tmp_path)
    with pytest.raises(common.BuildError, match="hidden pairs get weight 0"):
        pairs.check_saved(module)
    pairs.sync_saved(module)
    pairs.check_saved(module)
    assert "# hidden pairs get no weight" in module.read_text(encoding="utf-8")


def test_a_saved_cell_that_runs_code_is_refused(tmp_path, monkeypatch):
    page = tmp_path / "09_x.md"
    page.write_text("# T\n\n```{code-cell} ipython3\n#@save\ndef f():\n    return 1\n\nprint(f())\n```\n",
                    encoding="utf-8")
    with pytest.raises(common.BuildError, match="may only define"):
        pairs.saved_cells(page)


def test_a_visible_code_line_wider_than_the_page_fails_check_sync(tmp_path, monkeypatch):
    """Every code cell a reader can see counts, `hide-input` included; removed cells do not.
    The failure names the page, the line in the .md and its length."""
    wide = "x = " + "1 + " * 20 + "1"                                  # 85 characters
    page = tmp_path / "09_wide.md"
    page.write_text(
        "# T\n\n```{code-cell} ipython3\nshort = 1\n" + wide + "\n```\n\n"         # line 5
        "```{code-cell} ipython3\n:tags: [hide-input]\n\n" + wide + "\n```\n\n"    # line 11
        "```{code-cell} ipython3\n:tags: [remove-cell]\n\n" + wide + "\n```\n\n"
        "```{code-cell} ipython3\n:tags: [remove-input]\n\n" + wide + "\n```\n\n"
        "A paragraph of prose is not code, however long it is: " + "word " * 30 + "\n",
        encoding="utf-8")
    found = pairs.wide_lines(page)
    assert [line.split(":")[0] for line in found] == [f"{page}, line 5", f"{page}, line 11"]
    assert all(f"{len(wide)} characters (at most 76)" in line for line in found)
    monkeypatch.setattr(common, "NOTEBOOKS", tmp_path)
    with pytest.raises(common.BuildError, match=r"09_wide.md, line 11: 85 characters"):
        pairs.check_width()


def test_code_as_wide_as_the_page_passes(tmp_path):
    page = tmp_path / "09_fits.md"
    page.write_text("# T\n\n```{code-cell} ipython3\n" + "y" * 76 + "\n```\n", encoding="utf-8")
    assert pairs.wide_lines(page) == []


def test_every_line_of_the_module_fits_the_page():
    """Saved cells are copied into the module unchanged, and the hand-written part follows:
    a reader who opens scripts/tx_part4.py reads it at the width of the page."""
    lines = common.MODULE.read_text(encoding="utf-8").splitlines()
    wide = [f"line {number}: {len(line)} characters" for number, line in enumerate(lines, 1)
            if len(line) > pairs.CODE_WIDTH]
    assert not wide, (f"{len(wide)} line(s) of {common.rel(common.MODULE)} wider than "
                      f"{pairs.CODE_WIDTH} characters:\n  " + "\n  ".join(wide[:40]))


def test_the_setup_line_fits_the_page_and_keeps_each_fact_whole(monkeypatch):
    """The line that opens every page: at most 76 characters a line, on any machine (a long CPU
    name wraps to more lines), each fact on one line, as the pages and tests quote them."""
    cpu = "AMD EPYC 9654 96-Core Processor with a name longer than most (R)"
    facts = {"cpu": cpu, "cores": 192, "largest_cache_bytes": 384 * 2**20}
    monkeypatch.setenv(tx.MACHINE_ENV, json.dumps(facts))
    text = tx.setup()
    lines = text.split("\n")
    assert len(lines) >= 3 and all(len(line) <= tx.WIDTH for line in lines), text
    for fact in (cpu, "192 cores", "largest cache 384 MiB", f"torch {torch.__version__}"):
        assert any(fact in line for line in lines), (fact, text)


def test_the_stated_examples_print_within_the_page():
    """print() of the example model and accelerator: their repr, wrapped at 76 characters."""
    for example in (tx.ExampleModel(), tx.ExampleAccelerator(), tx.ExampleModel(kv_heads=1)):
        text = str(example)
        assert all(len(line) <= tx.WIDTH for line in text.split("\n")), text
        assert text.replace("\n    ", " ") == repr(example)
