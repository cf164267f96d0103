"""The GitHub Actions workflows (.github/workflows/), checked offline, and what the build does
when it runs in one.

* Every workflow file is valid against GitHub's workflow schema, read from the pinned validator
  (check-jsonschema carries it: no network), and every `run:` step calls a make target that
  `make -n` accepts. A broken copy shows each failure naming the file and the line.
* Actions pinned to a release, caches keyed by what changes them; off the pins a release
  name is checked to be a version; `make newest`'s stamp keeps its environment.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from bookbuild import common, execute, numbers

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
SCHEMA = "vendor.github-workflows"                 # check-jsonschema's copy of GitHub's schema
#: A release tag (v1.2.3) or a full commit: a moving major tag (v4) or a branch is not a pin.
PINNED = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@(v\d+\.\d+\.\d+|[0-9a-f]{40})$")


def workflow_files(folder: Path = WORKFLOWS) -> list[Path]:
    """Every workflow file of a folder."""
    return sorted([*folder.glob("*.yml"), *folder.glob("*.yaml")])


def load(path: Path) -> dict:
    """A workflow as data; its `on:` key is read as the string (YAML 1.1 would make it True)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if True in data:
        data["on"] = data.pop(True)
    return data


# ── where in the file: a JSON path of the validator as a line of the file ──────────────────


def node_at(root, path: str):
    """The YAML node that a JSON path such as `$.jobs.book.steps[2]` names, and the node of the
    key that holds it (for a line that shows the key); as far as the path can be followed."""
    node, key_node = root, None
    for dotted, index, quoted in re.findall(r"\.([^.\[]+)|\[(\d+)\]|\['([^']*)'\]",
                                            path.removeprefix("$")):
        name = dotted or quoted
        if name and isinstance(node, yaml.MappingNode):
            found = next(((k, v) for k, v in node.value if k.value == name), None)
            if found is None:
                break
            key_node, node = found
        elif index and isinstance(node, yaml.SequenceNode) and int(index) < len(node.value):
            key_node, node = None, node.value[int(index)]
        else:
            break
    return node, key_node


def line_of(text: str, path: str, message: str = "") -> int:
    """The line (1-based) an error at a JSON path points at. An unexpected key named in the
    message (`'timeout_minutes' was unexpected`) points at that key's own line."""
    node, key_node = node_at(yaml.compose(text), path)
    unexpected = re.findall(r"'([^']+)'", message.partition("(")[2]) if "unexpected" in message else []
    if unexpected and isinstance(node, yaml.MappingNode):
        for key, _ in node.value:
            if key.value in unexpected:
                return key.start_mark.line + 1
    return (key_node or node).start_mark.line + 1


# ── the schema ────────────────────────────────────────────────────────────────────────────


def schema_problems(files: list[Path]) -> list[str]:
    """`FILE:LINE: $.json.path: message` for every schema error, from the pinned validator."""
    done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", SCHEMA,
                           "--output-format", "json", *map(str, files)],
                          capture_output=True, text=True)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        return [f"check-jsonschema failed to run (exit {done.returncode}): {done.stderr[-800:]}"]
    problems = []
    for error in report.get("errors", []):
        best = error.get("best_deep_match") or error.get("best_match") or error
        path = Path(error["filename"])
        line = line_of(path.read_text(encoding="utf-8"), best["path"], best["message"])
        problems.append(f"{path.name}:{line}: {best['path']}: {best['message']}")
    for error in report.get("parse_errors", []):
        problems.append(f"{Path(error.get('filename', '?')).name}: not YAML: {error.get('message')}")
    if done.returncode != 0 and not problems:
        problems.append(f"check-jsonschema exited {done.returncode}: {done.stdout[-800:]}")
    return problems


# ── the run: steps and their make targets ─────────────────────────────────────────────────


def run_steps(path: Path) -> list[tuple[int, str, str]]:
    """(line, job, script) of every `run:` step of a workflow."""
    root = yaml.compose(path.read_text(encoding="utf-8"))
    steps = []
    jobs, _ = node_at(root, "$.jobs")
    for job_key, job in jobs.value if isinstance(jobs, yaml.MappingNode) else []:
        found, _ = node_at(job, "$.steps")
        for step in found.value if isinstance(found, yaml.SequenceNode) else []:
            for key, value in step.value:
                if key.value == "run":
                    steps.append((key.start_mark.line + 1, job_key.value, value.value))
    return steps


def make_calls(script: str) -> list[list[str]] | None:
    """The targets of each `make` command of a shell script (a command without a target: the
    default, as []); None if a command of the script is not make."""
    calls = []
    for line in script.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for command in re.split(r"&&|\|\||;", line):
            words = shlex.split(command)
            while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
                words.pop(0)                            # VAR=value make ...
            if not words or words[0] != "make":
                return None
            calls.append([w for w in words[1:] if not w.startswith("-") and "=" not in w])
    return calls


def make_accepts(target: str) -> str | None:
    """None if `make -n TARGET` (a dry run: nothing is executed) accepts the target, else make's
    complaint."""
    # as a top-level make, also when `make test` runs this (no "make[1]:" in the message)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    done = subprocess.run(["make", "-n", *([target] if target else [])], cwd=ROOT,
                          capture_output=True, text=True, env=env)
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]


def step_problems(files: list[Path]) -> list[str]:
    """`FILE:LINE: ...` for every `run:` step that is not make, or names a target make lacks."""
    problems = []
    for path in files:
        for line, job, script in run_steps(path):
            calls = make_calls(script)
            if not calls:
                problems.append(f"{path.name}:{line}: job {job}: the step runs {script.strip()!r}, "
                                f"not a make target (one source: .ci/run calls the same targets)")
                continue
            for targets in calls:
                for target in targets or [""]:
                    complaint = make_accepts(target)
                    if complaint:
                        problems.append(f"{path.name}:{line}: job {job}: `make {target}`: "
                                        f"make -n {target} fails: {complaint}")
    return problems


def ci_run_targets() -> set[str]:
    """The make targets that .ci/run calls."""
    targets = set()
    for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines():
        words = shlex.split(line.split("#", 1)[0])
        if words[:1] == ["make"]:
            targets |= {w for w in words[1:] if not w.startswith("-") and "=" not in w}
    return targets


# ── the workflows as they are ─────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def workflows() -> dict[str, dict]:
    files = workflow_files()
    assert files, f"no workflow in {WORKFLOWS.relative_to(ROOT)}"
    return {path.name: load(path) for path in files}


def test_every_workflow_matches_githubs_schema():
    problems = schema_problems(workflow_files())
    assert not problems, "\n".join(problems)


def test_every_run_step_calls_a_make_target_that_exists():
    problems = step_problems(workflow_files())
    assert not problems, "\n".join(problems)


def test_the_workflow_and_ci_run_call_the_same_targets(workflows):
    called = {target for path in workflow_files() if path.name == "book.yml"
              for _, _, script in run_steps(path) for call in make_calls(script) or [] for target in call}
    assert called == ci_run_targets(), "book.yml and .ci/run must run the same make targets"


def test_every_action_is_pinned_to_a_release(workflows):
    used = [(name, step["uses"]) for name, flow in workflows.items() for job in flow["jobs"].values()
            for step in job.get("steps", []) if "uses" in step]
    assert used
    loose = [f"{name}: {uses}" for name, uses in used if not PINNED.match(uses)]
    assert not loose, "actions not pinned to a release (vX.Y.Z or a commit):\n" + "\n".join(loose)


def test_the_caches_are_keyed_by_what_changes_them(workflows):
    jobs = workflows["book.yml"]["jobs"]
    caches = {(job, s["name"]): s["with"] for job, spec in jobs.items() for s in spec["steps"]
              if s.get("uses", "").startswith("actions/cache")}
    pip = [w for (_, name), w in caches.items() if w["path"] == "~/.cache/pip"]
    assert pip and all("'requirements.txt', 'pyproject.toml'" in w["key"] for w in pip)
    execution = [w for w in caches.values() if "_build/.jupyter_cache" in w["path"]]
    assert len(execution) == 1                      # the book job's, across runs
    # what the stamp beside the cache hashes, and the notebooks (jupyter-cache's own key)
    for name in ("notebooks/*.md", *execute.STAMP_FILES):
        part = name + "/**" if (common.ROOT / name).is_dir() else name
        assert f"'{part}'" in execution[0]["key"], part
    assert "_build/jupyter_cache.inputs" in execution[0]["path"]
    assert execution[0]["key"].startswith(execution[0]["restore-keys"])
    assert jobs["book"]["env"]["FRESH"].count("'0'") == 1     # pull requests: from the cache


def test_the_site_renders_the_execution_this_run_checked(workflows):
    """The site job takes the book job's execution as an artifact of the same run, never from
    the cache (an exact hit is not saved again, so the cache can hold an older run's)."""
    jobs = workflows["book.yml"]["jobs"]
    steps = {job: {s.get("uses", "").split("@")[0]: s.get("with", {}) for s in jobs[job]["steps"]}
             for job in ("book", "site")}
    upload, download = steps["book"]["actions/upload-artifact"], steps["site"]["actions/download-artifact"]
    assert upload["name"] == download["name"] and download["path"] == "_build"
    assert set(upload["path"].split()) == {"_build/.jupyter_cache", "_build/jupyter_cache.inputs"}
    assert upload["include-hidden-files"] is True                  # .jupyter_cache starts with a dot
    read = [s for s in jobs["site"]["steps"] if s.get("uses", "").startswith("actions/cache")
            and "jupyter_cache" in s["with"]["path"]]
    assert not read, "the site job reads the execution cache"
    assert "book" in jobs["site"]["needs"]


# ── the checks fail on a broken copy, naming the file and the line ────────────────────────


def broken_copy(tmp_path: Path, old: str, new: str) -> tuple[Path, int]:
    """book.yml with one change, and the line of the change."""
    text = (WORKFLOWS / "book.yml").read_text(encoding="utf-8")
    assert old in text
    copy = tmp_path / "book.yml"
    copy.write_text(text.replace(old, new, 1), encoding="utf-8")
    return copy, text[:text.index(old)].count("\n") + 1


def test_a_typo_in_a_key_fails_naming_the_file_and_the_line(tmp_path):
    copy, line = broken_copy(tmp_path, "timeout-minutes: 15", "timeout_minutes: 15")
    assert schema_problems([copy]) == [
        f"book.yml:{line}: $.jobs.deploy: Additional properties are not allowed "
        f"('timeout_minutes' was unexpected)"]


def test_a_wrong_value_fails_naming_the_file_and_the_line(tmp_path):
    copy, line = broken_copy(tmp_path, "cancel-in-progress: false", "cancel-in-progress: never")
    problems = schema_problems([copy])
    assert len(problems) == 1 and problems[0].startswith(f"book.yml:{line}: $.jobs.deploy.concurrency")


def test_a_step_that_calls_a_missing_target_fails_naming_the_file_and_the_line(tmp_path):
    copy, line = broken_copy(tmp_path, "run: make site-test", "run: make site-tests")
    problems = step_problems([copy])
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"book.yml:{line}: job site: `make site-tests`: make -n site-tests "
                                  f"fails: make: *** No rule to make target 'site-tests'")


def test_a_step_that_is_not_make_fails_naming_the_file_and_the_line(tmp_path):
    copy, line = broken_copy(tmp_path, "run: make pdf", "run: .venv/bin/python scripts/pdf.py")
    assert step_problems([copy]) == [
        f"book.yml:{line}: job site: the step runs '.venv/bin/python scripts/pdf.py', not a make "
        f"target (one source: .ci/run calls the same targets)"]


def test_make_calls_reads_targets_and_refuses_other_commands():
    assert make_calls("make test") == [["test"]]
    assert make_calls("FRESH=1 make book FRESH=1 -j2 && make pdf  # then the PDF") == [["book"], ["pdf"]]
    assert make_calls("make") == [[]]
    assert make_calls("make book\npython -m pytest") is None


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_dry_run_refuses_an_unknown_target():
    assert make_accepts("book") is None
    assert "No rule to make target 'no-such-target'" in make_accepts("no-such-target")


def test_on_the_newest_releases_a_release_name_is_not_a_drift(monkeypatch):
    """The weekly build names a newer transformers on its pages: with
    WHY_SELF_ATTENTION_RELEASES=newest that key must be a version, not the pin; all else as always."""
    page = next(p for p, keys in numbers.load_expected().items() if "transformers_version" in keys)
    expected = {page: numbers.load_expected()[page]}
    glued = {page: {key: execute.Glued(e["value"], e["kind"], e.get("tol"), None, e.get("threshold"),
                                    e.get("values")) for key, e in expected[page].items()}}
    glued[page]["transformers_version"].value = "5.99.0"
    monkeypatch.setattr(numbers, "load_expected", lambda: expected)
    monkeypatch.delenv(numbers.RELEASES, raising=False)
    with pytest.raises(common.BuildError, match="transformers_version"):
        numbers.check_numbers([page], glued=glued)
    monkeypatch.setenv(numbers.RELEASES, "newest")
    numbers.check_numbers([page], glued=glued)                          # passes: not compared
    glued[page]["transformers_version"].value = "not a release"
    with pytest.raises(common.BuildError, match="not a version string"):
        numbers.check_numbers([page], glued=glued)


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_keeps_the_newest_environment_until_the_pins_change(tmp_path):
    """After `make newest`, `make book` and `make test` use that environment as it is (its stamp
    is newer than the pins); once requirements.txt changes, `make env` rebuilds from the pins."""
    import os

    for name in ("Makefile", "requirements.txt", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text("")
    (tmp_path / ".venv" / ".pins").write_text("# make newest\ntorch==2.15.0+cpu\n")
    dry_run = lambda: subprocess.run(["make", "-n", "env"], cwd=tmp_path, capture_output=True,  # noqa: E731
                                     text=True, check=True).stdout
    assert "pip install" not in dry_run()                          # kept as it is
    later = (tmp_path / ".venv" / ".pins").stat().st_mtime + 10
    os.utime(tmp_path / "requirements.txt", (later, later))        # the pins change
    assert "recreating" in dry_run() and "pip install --quiet --no-deps -r requirements.txt" in dry_run()


def test_the_newest_environment_takes_the_declared_ranges_not_the_lock():
    from bookbuild import newest

    commands = newest.commands("python")
    assert commands[1][5:] == ["torch>=2.13,<3", "--index-url", newest.TORCH_INDEX]
    assert commands[2][5:] == ["-e", f"{ROOT}[book,test]"]
    assert not any("requirements" in word for command in commands for word in command)


def test_the_lock_holds_every_declared_package_within_its_range():
    """requirements.txt (`make lock`) holds every package pyproject.toml declares, its
    dependencies and both extras, at a version within the declared range."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = project["dependencies"] + sum(project["optional-dependencies"].values(), [])
    locked = {}
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            locked[canonicalize_name(name)] = version
    assert len(declared) >= 25 and len(locked) >= len(declared)
    wrong = [f"{r}: locked {version}" for r in map(Requirement, declared)
             if (version := locked.get(canonicalize_name(r.name))) is None
             or not r.specifier.contains(version, prereleases=True)]
    assert not wrong, "the lock (requirements.txt) against pyproject.toml: " + "; ".join(wrong)


def test_git_trusts_the_checkout_in_every_container_job(workflows):
    """Jobs run as root in a container on a checkout owned by the runner's user: without
    safe.directory, every git call of the build and the tests (ls-files, diff) fails."""
    for name, flow in workflows.items():
        if any("container" in job for job in flow["jobs"].values()):
            env = flow.get("env", {})
            keys = {env.get(f"GIT_CONFIG_KEY_{i}"): env.get(f"GIT_CONFIG_VALUE_{i}")
                    for i in range(int(env.get("GIT_CONFIG_COUNT", 0)))}
            assert keys.get("safe.directory") == "*", name
