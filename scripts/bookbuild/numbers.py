"""Stage 3, numbers: every glued value against its expectation in
numbers.toml (`check_numbers`), and `make numbers`, which accepts the
build's values into numbers.toml and shows the diff."""

from __future__ import annotations

import difflib
import itertools
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from bookbuild.common import NUMBERS, fail, module_constant
from bookbuild.execute import Glued, glued_values

# exact, close, seeded, measured, recorded
KINDS = module_constant("KINDS")
#: relative tolerance where numbers.toml gives none
DEFAULT_TOL = {"close": 1e-9, "seeded": 1e-6}

def load_expected(path: Path = NUMBERS) -> dict[str, dict[str, dict]]:
    """numbers.toml: {page: {key: {kind, value, tol?, published?,
    meaning?}}}."""
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    for page, keys in data.items():
        for key, entry in keys.items():
            if entry.get("kind") not in KINDS:
                fail(f"numbers.toml [{page}] {key}: kind must be one of {KINDS}, got {entry.get('kind')!r}")
    return data


def toml_key(key: str) -> str:
    """A TOML key, quoted unless it is bare."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def dump_expected(data: dict[str, dict[str, dict]], header: str) -> str:
    """numbers.toml as text: the header comment, one line per key, pages
    in order, keys in the order glued (a value as JSON writes it is TOML).
    """
    lines = [header.rstrip("\n")]
    for page in sorted(data):
        lines += ["", f"[{toml_key(page)}]"]
        for key, entry in data[page].items():
            fields = ", ".join(
                f"{name} = {json.dumps(entry[name], ensure_ascii=False)}"
                for name in ("kind", "value", "values", "threshold", "tol",
                             "published", "meaning")
                if entry.get(name) is not None)
            lines.append(f"{toml_key(key)} = {{ {fields} }}")
    return "\n".join(lines) + "\n"


# ── the check ─────────────────────────────────────────────────────────────────────────────


@dataclass
class Problem:
    """One row of the drift table."""
    page: str
    key: str
    kind: str
    expected: object
    got: object
    reason: str
    margin: str = ""          # a claim's "ratio / threshold", where the value is a claim


def significant(text: str) -> int:
    """Significant digits written in a published number, e.g. '0.133' → 3,
    '3.28e-05' → 3."""
    mantissa = text.lower().split("e")[0].replace("-", "").replace(".", "").lstrip("0")
    return max(1, len(mantissa.rstrip("0")) if "." not in text else len(mantissa))


def agrees_with_published(value, published) -> bool:
    """Does the built value, rounded as the companion article rounds it,
    give the printed number?"""
    if isinstance(published, (bool, str)) or isinstance(value, (bool, str)):
        return value == published
    if isinstance(published, int) and isinstance(value, int):
        return value == published
    digits = significant(repr(published))
    return float(f"{float(value):.{digits}g}") == float(f"{float(published):.{digits}g}")


def is_number(value) -> bool:
    """A finite int or float (not a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def claim_margin(glued: Glued | None) -> str:
    """A claim's ratio and threshold as the drift table and the ledger show
    them."""
    if glued is None or glued.margin is None:
        return ""
    return f"{glued.ratio:.3g} / {glued.threshold:.3g} = {glued.margin:.2f}"


#: Which releases the build runs on: unset (or "pinned") for the pins;
#: "newest" in the weekly workflow (`make newest`); `make compat` sets
#: "lowest" or "colab" in its own environments.
RELEASES = "WHY_SELF_ATTENTION_RELEASES"
#: Glued keys that name the torch or transformers release a page ran on ("in
#: transformers 5.24.0"). Off the pins they differ by design: each must be a
#: version string, not the pin.
RELEASE_KEY = re.compile(r"(^|_)(transformers|torch)_version$")


def on_the_pins(environ=None) -> bool:
    """Does this build run on the pinned releases
    (WHY_SELF_ATTENTION_RELEASES unset)?"""
    return (os.environ if environ is None else environ).get(RELEASES, "pinned") == "pinned"


def compare_one(page: str, key: str, entry: dict, value, glued: Glued | None = None) -> Problem | None:
    """Check one glued value against its expectation. Off the pins, a
    release name is checked to be a version string, not compared (every
    caller, the build's, the tests' and compat's)."""
    kind, expected = entry["kind"], entry.get("value")
    problem = lambda reason: Problem(page, key, kind, expected, value, reason,  # noqa: E731
                                     claim_margin(glued))
    if RELEASE_KEY.search(key) and not on_the_pins():
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?\S*", str(value)):
            return problem("not a version string")
        return None
    if kind in ("measured", "recorded"):
        allowed = entry.get("values")
        if allowed is not None:
            if value not in allowed:
                return problem(f"a phrase must be one of {allowed}")
            return None
        # a span as printed, "5.9 to 9.1" or "6.0": a measured range
        span = isinstance(value, str) and re.fullmatch(r"[\d.,]+( to [\d.,]+)?", value)
        if not (is_number(value) or span):
            return problem(f"a {kind} value must be a finite number or a span such as "
                           "'5.9 to 9.1' (a phrase needs `values`)")
        return None
    if kind == "exact":
        if type(value) is not type(expected) or value != expected:
            return problem("drifted")
    else:
        if not (is_number(value) and is_number(expected)):
            return problem("not a number")
        tol = entry.get("tol") or DEFAULT_TOL[kind]
        if not math.isclose(value, expected, rel_tol=tol, abs_tol=tol * 1e-12):
            return problem(f"drifted beyond rel. tol {tol:g}")
    threshold = entry.get("threshold")
    if threshold is not None and (glued is None or glued.threshold != threshold):
        return problem(f"a claim with threshold {threshold:g} in numbers.toml, glued with "
                       f"{'none' if glued is None or glued.threshold is None else f'{glued.threshold:g}'}")
    published = entry.get("published")
    if published is not None and kind in ("exact", "close") and not agrees_with_published(value, published):
        return Problem(page, key, kind, published, value, "disagrees with the companion articles")
    return None


def compare(expected: dict[str, dict[str, dict]], glued: dict[str, dict[str, Glued]]) -> list[Problem]:
    """Every drift, every missing key, every glued key without an
    expectation."""
    problems = []
    for page in sorted(set(expected) | set(glued)):
        want, have = expected.get(page, {}), glued.get(page)
        if have is None:
            problems.append(Problem(page, "*", "-", f"{len(want)} keys", None, "page not executed"))
            continue
        for key, entry in want.items():
            if key not in have:
                problems.append(Problem(page, key, entry["kind"], entry.get("value"), None,
                                        "missing: expected but not glued"))
            else:
                found = compare_one(page, key, entry, have[key].value, have[key])
                if found:
                    problems.append(found)
        for key in have:
            if key not in want:
                problems.append(Problem(page, key, "-", None, have[key].value,
                                        "unexpected: glued but not in numbers.toml (run `make numbers`)"))
    return problems


def fmt(value) -> str:
    """A value as the drift table and the ledger show it."""
    if value is None:
        return "—"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return f"{value:.10g}" if isinstance(value, float) else str(value)


def problem_table(problems: list[Problem]) -> str:
    """The drift table, one row per problem, readable in a terminal."""
    import pandas as pd

    rows = [(p.page, p.key, p.kind, fmt(p.expected), fmt(p.got),
             p.margin or "—", p.reason) for p in problems]
    columns = ["page", "key", "kind", "expected", "got",
               "ratio / threshold", "what"]
    return pd.DataFrame(rows, columns=columns).to_string(index=False)


def check_numbers(only: list[str] | None = None, glued: dict | None = None) -> None:
    """Compare the build's glued values with numbers.toml; fail with a table
    of every problem."""
    expected, glued = load_expected(), glued if glued is not None else glued_values(only)
    if only:
        expected = {page: keys for page, keys in expected.items() if page in only}
    problems = compare(expected, glued)
    total = sum(len(keys) for keys in glued.values())
    if problems:
        fail(f"number check: {len(problems)} problem(s) in {total} glued values\n"
             f"{problem_table(problems)}\n"
             f"If a change is on purpose, run `make numbers`, read the diff, and say so in the commit.")
    print(f"numbers: {total} glued values on {len(glued)} pages match numbers.toml")
    if not on_the_pins():
        print(f"  ({RELEASES}={os.environ[RELEASES]}: the release names each page glues were "
              f"checked to be versions, not compared with the pins)")


def accept_numbers(only: list[str] | None = None) -> None:
    """Write the build's glued values into numbers.toml, keeping kinds,
    published values and meanings."""
    old = load_expected()
    new: dict[str, dict[str, dict]] = {page: keys for page, keys in old.items()
                                       if only and page not in only}
    for page, keys in glued_values(only).items():
        new[page] = {}
        for key, glued in keys.items():
            entry = dict(old.get(page, {}).get(key, {}))
            entry.setdefault("kind", glued.kind or ("close" if isinstance(glued.value, float) else "exact"))
            if glued.tol is not None and "tol" not in entry:
                entry["tol"] = glued.tol
            if glued.values is not None:
                # a phrase: the words it may take
                entry["values"] = list(glued.values)
            if glued.threshold is not None:
                # a claim: the threshold it must exceed
                entry["threshold"] = glued.threshold
            entry["value"] = glued.value
            new[page][key] = entry
    before = NUMBERS.read_text(encoding="utf-8") if NUMBERS.exists() else ""
    header = "".join(itertools.takewhile(lambda line: line.startswith("#"),
                                         before.splitlines(True)))
    after = dump_expected(new, header)
    diff = list(difflib.unified_diff(before.splitlines(), after.splitlines(),
                                     "numbers.toml (before)", "numbers.toml (after)", lineterm=""))
    NUMBERS.write_text(after, encoding="utf-8")
    print("\n".join(diff) if diff else "numbers.toml: no change")
