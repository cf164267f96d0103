"""A fresh `make book` in 40 s on two cores: kernels forked from a warm server
(scripts/warm_kernels.py), Sphinx reading each page as its notebook finishes
(book.RenderAlongside, scripts/executed_pages.py), two shortcuts through Sphinx's writing
(scripts/fast_render.py) and an exit without Python's teardown (scripts/render.py). Each is
checked on crafted notebooks and small Sphinx projects: no notebook of the book runs here."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import book
import executed_pages
import warm_kernels
from test_edit_loop import HEADER  # a MyST notebook's front matter


def notebook(path: Path, *cells: str) -> Path:
    """A small MyST notebook with these code cells."""
    body = "".join(f"```{{code-cell}} ipython3\n{code}\n```\n\n" for code in cells)
    path.write_text(f"{HEADER}\n# A page\n\nSome prose.\n\n{body}", encoding="utf-8")
    return path


def outputs(notebook_node) -> list[dict]:
    """The outputs of every code cell, in order."""
    return [out for cell in notebook_node.cells if cell.cell_type == "code"
            for out in cell.outputs]


def text_of(notebook_node) -> str:
    """What the cells printed."""
    return "".join(out.get("text", "") for out in outputs(notebook_node))


# ── warm kernels ──────────────────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def server():
    """One warm server for the module (its imports take seconds), as the build starts it."""
    started = warm_kernels.Server({**os.environ, "MPLBACKEND": book.INLINE_BACKEND})
    assert started.ready(), started.reason
    yield started
    started.close()


def test_a_forked_kernel_runs_a_notebook_and_draws_its_figures(server, tmp_path):
    md = notebook(tmp_path / "09_page.md", "print(6 * 7)",
                  "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])",
                  "fig, ax = plt.subplots()\nax.plot([3, 2])\nplt.show()")
    _, _, error, executed = book._execute_one(str(md), server.path)
    assert error is None, error
    assert text_of(executed).strip() == "42"
    figures = [out for out in outputs(executed) if "image/png" in out.get("data", {})]
    assert len(figures) == 2                       # drawn at the cell's end, and by plt.show()
    # jupyter-cache's key is the source's: Sphinx finds these outputs (timings in the cells'
    # metadata would change the key, and Sphinx would run the notebook again, itself)
    from jupyter_cache import get_cache

    cache = get_cache(str(tmp_path / "cache"))
    assert cache.create_hashed_notebook(executed)[1] == \
        cache.create_hashed_notebook(book.read_for_cache(md))[1]


def test_a_render_that_executed_a_notebook_fails():
    """Sphinx runs a notebook whose outputs it does not find in the cache: the build says so."""
    log = f"{book.ROOT}/notebooks/07_x.md: Executing notebook using temporary CWD [mystnb]\n"
    with pytest.raises(book.BuildError, match="executed notebooks itself.*notebooks/07_x.md"):
        book.html_result(0, log, "")
    book.html_result(0, "build succeeded.\n", "")


def test_a_forked_kernel_has_the_kernels_environment_and_folder(server, tmp_path, monkeypatch):
    """The kernel's environment is the one jupyter_client gave the `kernel` command (not the
    server's), its folder the notebook's temporary one, and it is the server's child."""
    monkeypatch.setenv("WHY_SELF_ATTENTION_PROBE", "from the build")
    md = notebook(tmp_path / "09_page.md",
                  "import os, sys\n"
                  "print(os.environ.get('WHY_SELF_ATTENTION_PROBE'))\n"
                  "print(os.environ.get('JPY_PARENT_PID') is not None)\n"
                  "print(os.getppid())\n"
                  "print(os.listdir('.'))\n"
                  "print(any(p.endswith('scripts') for p in sys.path[:1]))")
    _, _, error, executed = book._execute_one(str(md), server.path)
    assert error is None, error
    probe, parent, ppid, folder, scripts_first = text_of(executed).splitlines()
    assert probe == "from the build"            # set after the server started
    assert parent == "True"                     # so the kernel prints no banner
    assert int(ppid) == server.process.pid
    assert folder == "[]"                       # an empty temporary folder, as a cold kernel's
    assert scripts_first == "False"


def test_a_failing_cell_in_a_forked_kernel_is_reported(server, tmp_path):
    md = notebook(tmp_path / "09_page.md", "x = 1", "raise ValueError('n must be positive')")
    _, _, error, executed = book._execute_one(str(md), server.path)
    assert executed is None
    assert "ValueError" in error and "n must be positive" in error


def test_a_forked_kernel_ends_with_its_notebook_and_leaves_no_thread(server, tmp_path):
    """Once the notebook has run, its kernel is stopped (jupyter_client kills the `kernel`
    command; the forked kernel ends with it), and the process that ran it holds no new thread:
    it may fork again (the build's workers do; so do the tests)."""
    md = notebook(tmp_path / "09_page.md", "import os\nprint(os.getpid())")
    _, _, error, executed = book._execute_one(str(md), server.path)
    assert error is None, error
    threads = warm_kernels.threads()
    _, _, error, executed = book._execute_one(str(md), server.path)
    assert error is None, error
    assert warm_kernels.threads() == threads
    pid = int(text_of(executed))
    for _ in range(100):
        if _state(pid) in ("gone", "Z"):
            break
        time.sleep(0.05)
    assert _state(pid) in ("gone", "Z")


def _state(pid: int) -> str:
    """A process's state letter (Z: ended, not yet reaped), or "gone"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "gone"


def test_the_server_ends_when_the_build_lets_go(tmp_path):
    started = warm_kernels.Server(dict(os.environ))
    assert started.ready(), started.reason
    started.close()
    assert started.process.wait(timeout=30) == 0
    assert not Path(started.folder).exists()        # the socket and its folder are removed


def test_imports_that_start_a_thread_make_the_server_refuse(tmp_path):
    """A fork copies only the thread that forks: a library that started a thread at import
    would leave its copy half-made. The server exits with code 3, and the build runs cold
    kernels (book.execute says why)."""
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    script = ("import sys, warm_kernels as w; w.PRELOAD = ('starts_a_thread',); "
              "w.serve(sys.argv[1])")
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(book.ROOT / "scripts")])}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "socket")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3
    assert "1 thread(s) started by the imports" in done.stderr
    assert not (tmp_path / "socket").exists()


def test_warm_kernels_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("WHY_SELF_ATTENTION_WARM", "0")
    assert book.start_warm() is None
    monkeypatch.setenv("WHY_SELF_ATTENTION_WARM", "1")
    assert book.warm_wanted() == sys.platform.startswith("linux")


def test_a_server_that_never_comes_says_why(monkeypatch, tmp_path):
    class Ended:
        pid = 0

        @staticmethod
        def poll():
            return 3

    started = warm_kernels.Server.__new__(warm_kernels.Server)
    started.path, started.process = str(tmp_path / "socket"), Ended()
    started.started = time.perf_counter()
    assert not started.ready()
    assert started.reason == "the server ended with code 3"


def test_the_kernel_command_names_the_server(tmp_path):
    manager = warm_kernels.kernel_manager(str(tmp_path / "socket"))
    command = manager.format_kernel_cmd()
    assert command[:4] == [sys.executable, os.path.abspath(warm_kernels.__file__), "kernel",
                           str(tmp_path / "socket")]
    assert command[4] == "-f"                      # then the connection file, as for a cold kernel


# ── the order of the notebooks, and Sphinx alongside ──────────────────────────────────────


def test_notebooks_finish_in_the_order_two_workers_end_them():
    seconds = {"a": 9.0, "b": 8.0, "c": 2.0, "d": 1.0}
    # a on one worker (0-9), b on the other (0-8), c after b (8-10), d after a (9-10 ... 9-10)
    assert book.finish_order(["a", "b", "c", "d"], seconds, workers=2) == ["b", "a", "c", "d"]
    assert book.finish_order(["a", "b"], seconds, workers=1) == ["a", "b"]


@pytest.fixture
def signals(tmp_path, monkeypatch):
    folder = tmp_path / "signals"
    folder.mkdir()
    (folder / "last").write_text("book/ledger\n")
    monkeypatch.setenv(executed_pages.SIGNALS, str(folder))
    return folder


def test_pages_without_outputs_come_first_then_notebooks_as_they_finish(signals):
    (signals / "order").write_text("05_e\n02_b\n")
    docnames = ["book/intro", "book/ledger", "notebooks/02_b", "notebooks/05_e", "book/zeta"]
    executed_pages.read_order(None, None, docnames)
    assert docnames == ["book/intro", "book/zeta", "notebooks/05_e", "notebooks/02_b",
                        "book/ledger"]


def test_an_ordinary_render_keeps_sphinx_order(monkeypatch):
    monkeypatch.delenv(executed_pages.SIGNALS, raising=False)
    docnames = ["b", "a"]
    executed_pages.read_order(None, None, docnames)
    assert docnames == ["b", "a"]


def test_a_page_waits_for_its_signal(signals):
    later = threading.Timer(0.2, (signals / "05_e").touch)
    later.start()
    start = time.monotonic()
    executed_pages.wait_for(signals / "05_e", "notebooks/05_e")
    assert time.monotonic() - start >= 0.15


def test_a_stopped_build_stops_the_waiting_render(signals):
    (signals / "stop").touch()
    with pytest.raises(Exception, match="the build stopped"):
        executed_pages.wait_for(signals / "05_e", "notebooks/05_e")


def test_a_written_page_is_read_again_once_written(signals, tmp_path):
    """The ledger waits for `all`, then Sphinx reads the text the build has just written."""
    ledger = tmp_path / "ledger.md"
    ledger.write_text("# Ledger\n\nnew\n")

    class App:
        class env:
            @staticmethod
            def doc2path(docname):
                return ledger

    (signals / "all").touch()
    source = ["# Ledger\n\nold\n"]
    executed_pages.wait_for_outputs(App, "book/ledger", source)
    assert source == ["# Ledger\n\nnew\n"]


def test_sphinx_waits_for_go_then_reads_each_notebook_page_when_told(tmp_path):
    """A small Sphinx project rendered as `make book` renders: nothing is read before `go`, a
    notebook's page waits for its signal, and the render ends once every signal is given."""
    src = tmp_path / "src"
    (src / "notebooks").mkdir(parents=True)
    (src / "book").mkdir()
    (src / "conf.py").write_text(f"import sys\nsys.path.insert(0, {str(book.ROOT / 'scripts')!r})\n"
                                 "extensions = ['executed_pages']\n", encoding="utf-8")
    (src / "index.rst").write_text("Index\n=====\n\n.. toctree::\n\n   notebooks/01_a\n   "
                                   "book/ledger\n", encoding="utf-8")
    (src / "notebooks" / "01_a.rst").write_text("A\n=\n\nText.\n", encoding="utf-8")
    (src / "book" / "ledger.rst").write_text("Ledger\n======\n\nold\n", encoding="utf-8")
    folder = tmp_path / "signals"
    folder.mkdir()
    (folder / "last").write_text("book/ledger\n")
    env = {**os.environ, executed_pages.SIGNALS: str(folder)}
    out = tmp_path / "out"
    render = subprocess.Popen([sys.executable, "-m", "sphinx", "-b", "html", "-q", str(src),
                               str(out)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    assert render.poll() is None and not (out / "index.html").exists()   # waits for go
    (folder / "order").write_text("01_a\n")
    (folder / "go").touch()
    time.sleep(1)
    assert render.poll() is None                              # waits for 01_a
    (folder / "01_a").touch()
    (src / "book" / "ledger.rst").write_text("Ledger\n======\n\nwritten\n", encoding="utf-8")
    (folder / "all").touch()
    assert render.wait(timeout=60) == 0, render.stderr.read()
    assert "written" in (out / "book" / "ledger.html").read_text(encoding="utf-8")


def test_the_build_says_where_its_time_went():
    lines = book.budget_report({"01_a": 3.0}, 30.0, phases={"pairs": 1.25, "execution": 20.0})
    assert "  where the build's time went: pairs 1.2 s, execution 20.0 s" in lines


# ── Sphinx's writing: the shortcuts give the same pages ──────────────────────────────────


def test_a_highlighted_block_is_the_same_and_made_once():
    from sphinx.highlighting import PygmentsBridge

    import fast_render

    bridge = PygmentsBridge("html")
    source = "def f(x):\n    return x * 2  # twice\n"
    want = fast_render._highlight_block(bridge, source, "python", {}, False, None)
    fast_render._highlighted.clear()
    assert fast_render.highlight_block(bridge, source, "python", {}) == want
    assert len(fast_render._highlighted) == 1
    fast_render.highlight_block(bridge, source, "python", {})
    fast_render.highlight_block(bridge, source, "python", {}, linenos=True)
    assert len(fast_render._highlighted) == 2        # other arguments: highlighted apart


NUMREF_PROJECT = {
    "index.rst": "Index\n=====\n\n.. toctree::\n   :numbered:\n\n   one\n   two\n",
    "one.rst": "One\n===\n\n.. _fig-a:\n\n.. figure:: a.png\n\n   A figure.\n\n"
               "Code::\n\n   x = 1  # a comment\n",
    "two.rst": "Two\n===\n\nSee :numref:`fig-a` and :numref:`Figure {number}, {name} <fig-a>`.\n\n"
               ".. code-block:: python\n\n   def f():\n       return 2\n",
}


def render_project(tmp_path: Path, extensions: list[str]) -> dict[str, str]:
    """Render NUMREF_PROJECT with these extensions; the pages' HTML."""
    from sphinx.application import Sphinx

    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    for name, text in NUMREF_PROJECT.items():
        (src / name).write_text(text, encoding="utf-8")
    (src / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (src / "conf.py").write_text(f"import sys\nsys.path.insert(0, {str(book.ROOT / 'scripts')!r})\n"
                                 f"extensions = {extensions!r}\nnumfig = True\n", encoding="utf-8")
    out = tmp_path / "_".join(extensions or ["plain"])
    app = Sphinx(str(src), str(src), str(out), str(out / ".doctrees"), "html",
                 status=io.StringIO(), warning=io.StringIO(), freshenv=True)
    app.build()
    return {name: (out / name).with_suffix(".html").read_text(encoding="utf-8")
            for name in ("one.rst", "two.rst")}


def test_the_shortcuts_write_the_same_pages(tmp_path):
    """With fast_render, the highlighted code and the numbered references are the same."""
    plain = subprocess.run([sys.executable, "-c", _RENDER, str(tmp_path / "a"), "[]"],
                           capture_output=True, text=True, timeout=120)
    fast = subprocess.run([sys.executable, "-c", _RENDER, str(tmp_path / "b"),
                           "['fast_render']"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and fast.returncode == 0, plain.stderr + fast.stderr
    assert json.loads(plain.stdout) == json.loads(fast.stdout)
    pages = json.loads(fast.stdout)
    assert "Fig. 1.1" in pages["two.rst"] and "Figure 1.1, A figure." in pages["two.rst"]


# each render in its own process: fast_render replaces two Sphinx methods for the process
_RENDER = ("import sys, json, ast, pathlib; "
           f"sys.path[:0] = [{str(book.ROOT / 'tests')!r}, {str(book.ROOT / 'scripts')!r}]; "
           "import test_fast_build as t; p = pathlib.Path(sys.argv[1]); p.mkdir(); "
           "print(json.dumps(t.render_project(p, ast.literal_eval(sys.argv[2]))))")


# ── the render's exit ─────────────────────────────────────────────────────────────────────


def test_the_render_passes_jupyter_books_exit_code_on(tmp_path):
    """scripts/render.py ends without Python's teardown, with jupyter-book's exit code."""
    render = [sys.executable, str(book.ROOT / "scripts" / "render.py"), "build"]
    (tmp_path / "_config.yml").write_text("title: t\nonly_build_toc_files: true\n")
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\n")
    (tmp_path / "intro.md").write_text("# Intro\n\nA page.\n")
    done = subprocess.run([*render, str(tmp_path), "-W"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "_build" / "html" / "intro.html").exists()
    (tmp_path / "intro.md").write_text("# Intro\n\nA {ref}`missing-label`.\n")
    done = subprocess.run([*render, str(tmp_path), "-W", "-n"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1
    assert "missing-label" in done.stdout + done.stderr
