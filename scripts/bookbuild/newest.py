"""`make newest`: .venv with the newest releases pip allows within the
ranges pyproject.toml declares, not the pins (the weekly workflow).

    python3 scripts/book.py newest --venv .venv --stamp .venv/.pins

A new virtual environment gets torch's newest CPU build, then every package
of requirements*.txt without its pin but within its declared range, then the
book's helpers (editable), as `make env` installs them. A newer major
release outside a declared range is named in the job summary
(GITHUB_STEP_SUMMARY), not installed. The stamp `make env` keeps is
written last (pip freeze: newer than the pins and unlike them), so `make
book` uses this environment until requirements*.txt change. The weekly
workflow then runs `WHY_SELF_ATTENTION_RELEASES=newest make book`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
NAME = re.compile(r"^\s*([A-Za-z0-9][\w.-]*)(\[[^\]]*\])?\s*(.*?)\s*$")


def canonical(name: str) -> str:
    """A package name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_ranges() -> dict[str, str]:
    """{name: range} from pyproject.toml's dependencies and extras."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    project = tomllib.loads(text)["project"]
    lines = project["dependencies"] + sum(
        project.get("optional-dependencies", {}).values(), [])
    return {canonical(m[1]): m[3].replace(" ", "")
            for m in map(NAME.match, lines) if m[3]}


def unpinned(path: Path, ranges: dict[str, str]) -> list[str]:
    """A requirements file's packages, each within its declared range."""
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = NAME.match(line.split("#", 1)[0])
        if match:
            name = match[1] + (match[2] or "")
            found.append(name + ranges.get(canonical(match[1]), ""))
    return found


def commands(python: str) -> list[list[str]]:
    """The pip commands that fill the environment, in order."""
    ranges = declared_ranges()
    pip = [python, "-m", "pip", "install", "--quiet"]
    rest = [r for r in unpinned(ROOT / "requirements.txt", ranges)
            if canonical(NAME.match(r)[1]) != "torch"]
    nodeps = unpinned(ROOT / "requirements-nodeps.txt", ranges)
    return [pip + ["--upgrade", "pip"],
            pip + ["torch" + ranges["torch"], "--index-url", TORCH_INDEX],
            pip + rest, pip + ["--no-deps", *nodeps],
            pip + ["--no-deps", "-e", str(ROOT)]]


def outside_ranges(python: str) -> list[str]:
    """`name version (declared range)` for each package whose newest
    release is a major version its range leaves out."""
    found = []
    for name, spec in sorted(declared_ranges().items()):
        limit = re.search(r"<(\d+)(\.0)*(,|$)", spec)
        if not limit:
            continue
        index = ["--index-url", TORCH_INDEX] if name == "torch" else []
        listed = subprocess.run(
            [python, "-m", "pip", "index", "versions", name, *index],
            capture_output=True, text=True).stdout
        newest = re.match(r"\S+ \((\d+)[^)]*\)", listed)
        if newest and int(newest[1]) >= int(limit[1]):
            found.append(f"{name} {newest[0].split()[1][1:-1]} "
                         f"(declared {spec})")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", default=str(ROOT / ".venv"))
    parser.add_argument("--stamp", help="default: VENV/.pins")
    args = parser.parse_args(argv)
    venv = Path(args.venv)
    python = str(venv / "bin" / "python")
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for command in commands(python):
        print("$", " ".join(command[2:]), flush=True)
        if subprocess.run(command).returncode != 0:
            print("make newest FAILED", file=sys.stderr)
            return 1
    frozen = subprocess.run([python, "-m", "pip", "freeze"], check=True,
                            capture_output=True, text=True).stdout
    outside = outside_ranges(python)
    text = ("### The newest releases within the declared ranges\n\n"
            + (f"Newer major releases, not installed: {', '.join(outside)}"
               f".\n\n" if outside else "")
            + "```\n" + frozen + "```\n")
    print(text)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as out:
            out.write(text)
    stamp = Path(args.stamp) if args.stamp else venv / ".pins"
    stamp.write_text("# make newest, not the pins\n" + frozen,
                     encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
