"""`make newest`: .venv with the newest releases pip allows, not the pins
(the weekly workflow).

    python3 scripts/book.py newest --venv .venv --stamp .venv/.pins   what `make newest` runs
    python3 scripts/book.py newest --dry-run                        print the pip commands only

1. A new virtual environment (the old one is removed).
2. torch: the newest CPU build, from PyTorch's CPU index ($TORCH_INDEX_URL
   to use another).
3. Every package that requirements.txt names, without its pin but within the
   range that
   pyproject.toml declares for it (its dependencies and its `book` extra: the major versions the
   book is written for, Jupyter Book 1 among them), then requirements-nodeps.txt's the same way
   without dependencies, then the book's helpers (editable), as `make env` installs them.
4. The versions it installed, beside the pins, printed and, in a GitHub
   Actions job, appended to
   the job summary (GITHUB_STEP_SUMMARY): a changed release is in bold. A newer major release
   outside a declared range is named there, not installed; it does not fail the build.
5. The stamp that `make env` keeps (.venv/.pins), written last: it is newer
   than the pins, so
   `make book` and `make test` use this environment as it is. It lists the installed versions,
   not the pins, so a later change of requirements*.txt makes `make env` rebuild from the pins.

Then `WHY_SELF_ATTENTION_RELEASES=newest make book` (the weekly workflow
sets the variable): the keys that name the transformers release a page ran
on are checked to be a version string, not the pin, as in `make compat`;
every other number is checked as always.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements.txt"
NODEPS = ROOT / "requirements-nodeps.txt"
TORCH_INDEX = os.environ.get("TORCH_INDEX_URL") or "https://download.pytorch.org/whl/cpu"
#: A requirement line: its name (with extras), then a version specifier, a
#: marker or nothing.
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*(?:\[[^\]]*\])?)")


def canonical(name: str) -> str:
    """A package name as pip compares them (PEP 503), without extras."""
    return re.sub(r"[-_.]+", "-", name.split("[")[0]).lower()


def pins(path: Path) -> dict[str, str]:
    """{name: pinned version} of a requirements file (its `name==version`
    lines)."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;#]+)", line)
        if match:
            found[canonical(match.group(1))] = match.group(2)
    return found


def unpinned(path: Path) -> list[str]:
    """The packages a requirements file names, without their versions
    (extras kept)."""
    names = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0]
        match = REQUIREMENT.match(line)
        if match and not line.lstrip().startswith("-"):
            names.append(match.group(1))
    return names


def declared_ranges(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """{name: version range} that pyproject.toml declares, in its
    dependencies and its extras, for instance {"jupyter-book": ">=1,<2"}; a
    package it names without a range is left out."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    lines = project["dependencies"] + sum(project.get("optional-dependencies", {}).values(), [])
    ranges = {}
    for line in lines:
        match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*([<>=!~][^;]*?)?\s*", line)
        if match and match.group(2):
            ranges[canonical(match.group(1))] = match.group(2).replace(" ", "")
    return ranges


def within(name: str, ranges: dict[str, str]) -> str:
    """A requirement for the newest release of `name` within its declared
    range."""
    return name + ranges.get(canonical(name), "")


def commands(python: str, ranges: dict[str, str] | None = None) -> list[list[str]]:
    """The pip commands that fill the environment, in order."""
    ranges = declared_ranges() if ranges is None else ranges
    pip = [python, "-m", "pip", "install", "--quiet"]
    return [pip + ["--upgrade", "pip"],
            pip + [within("torch", ranges), "--index-url", TORCH_INDEX],
            # torch: from the CPU index above, only
            pip + [within(name, ranges) for name in unpinned(REQUIREMENTS) if canonical(name) != "torch"],
            pip + ["--no-deps"] + [within(name, ranges) for name in unpinned(NODEPS)],
            pip + ["--no-deps", "-e", str(ROOT)]]


def upper_major(spec: str) -> int | None:
    """The first major version a range leaves out (`<2` → 2), or None."""
    match = re.search(r"<\s*(\d+)(?:\.0)*(?:,|$)", spec)
    return int(match.group(1)) if match else None


def newest_release(python: str, name: str) -> str | None:
    """The newest release of a package on the package index (pip's own
    `index versions`)."""
    index = ["--index-url", TORCH_INDEX] if canonical(name) == "torch" else []
    listed = subprocess.run([python, "-m", "pip", "index", "versions", name, *index],
                            capture_output=True, text=True).stdout
    match = re.match(r"\S+ \(([^)]+)\)", listed)
    return match.group(1) if match else None


def outside_ranges(ranges: dict[str, str], newest) -> list[str]:
    """`name version (declared range)` for each package whose newest release
    is a major version that its declared range leaves out. `newest(name)`
    gives that release, or None if unknown."""
    found = []
    for name, spec in sorted(ranges.items()):
        limit = upper_major(spec)
        release = newest(name) if limit is not None else None
        if release and int(re.match(r"\d+", release).group()) >= limit:
            found.append(f"{name} {release} (declared {spec})")
    return found


def installed(python: str) -> dict[str, str]:
    """{name: version} of every package in the environment."""
    listed = subprocess.run([python, "-m", "pip", "list", "--format", "json"], check=True,
                            capture_output=True, text=True).stdout
    return {canonical(p["name"]): p["version"] for p in json.loads(listed)}


def same_release(pin: str, have: str | None) -> bool:
    """Is an installed version the pinned release? A local label
    (2.13.0+cpu) is the same release."""
    return have is not None and have.split("+")[0] == pin.split("+")[0]


def versions_table(pinned: dict[str, str], ran: dict[str, str]) -> str:
    """Markdown: each pinned package, its pin, and the release this build
    ran (bold if new)."""
    lines = ["| package | pinned | ran |", "| --- | --- | --- |"]
    for name in sorted(pinned):
        have = ran.get(name, "not installed")
        shown = have if same_release(pinned[name], have) else f"**{have}**"
        lines.append(f"| {name} | {pinned[name]} | {shown} |")
    return "\n".join(lines)


def changed(pinned: dict[str, str], ran: dict[str, str]) -> list[str]:
    """`name pin → version` for each package whose release differs from its
    pin."""
    return [f"{name} {pin} → {ran.get(name, 'not installed')}"
            for name, pin in sorted(pinned.items()) if not same_release(pin, ran.get(name))]


def report(pinned: dict[str, str], ran: dict[str, str], summary: str | None,
           outside: list[str] = ()) -> str:
    """The versions as text; appended to the job summary where one is given.
    """
    differ = changed(pinned, ran)
    text = ("### The newest releases within the declared ranges, not the pins\n\n"
            f"torch from {TORCH_INDEX}. {len(differ)} of {len(pinned)} pinned packages ran "
            f"another release{': ' + ', '.join(differ) if differ else ''}.\n\n"
            + (f"Newer major releases, outside the ranges pyproject.toml declares (not installed; "
               f"the book is not yet written for them): {', '.join(outside)}.\n\n" if outside else "")
            + f"{versions_table(pinned, ran)}\n\n")
    if summary:
        with open(summary, "a", encoding="utf-8") as out:
            out.write(text)
    return text


def write_stamp(stamp: Path, ran: dict[str, str]) -> None:
    """The stamp `make env` keeps, newer than the pins: the versions
    installed, not the pins (so that a change of the pins, when it makes
    `make env` look, never matches it)."""
    stamp.write_text("# the newest releases (make newest), not the pins\n"
                     + "".join(f"{name}=={version}\n" for name, version in sorted(ran.items())),
                     encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", default=str(ROOT / ".venv"))
    parser.add_argument("--stamp", default=None, help="the file `make env` keeps (default VENV/.pins)")
    parser.add_argument("--dry-run", action="store_true", help="print the pip commands, run nothing")
    args = parser.parse_args(argv)
    venv = Path(args.venv)
    stamp = Path(args.stamp) if args.stamp else venv / ".pins"
    python = str(venv / "bin" / "python")
    if args.dry_run:
        print("\n".join(" ".join(command) for command in commands(python)))
        return 0
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for command in commands(python):
        print("$", " ".join(command[2:]), flush=True)
        if subprocess.run(command).returncode != 0:
            print(f"\nmake newest FAILED: {' '.join(command[2:])}", file=sys.stderr)
            return 1
    ran = installed(python)
    outside = outside_ranges(declared_ranges(), lambda name: newest_release(python, name))
    print(report({**pins(REQUIREMENTS), **pins(NODEPS)}, ran, os.environ.get("GITHUB_STEP_SUMMARY"),
                 outside))
    write_stamp(stamp, ran)
    return 0


if __name__ == "__main__":
    sys.exit(main())
