"""Stage 3: every glued value against numbers.toml (`check_numbers`), and
`make numbers`, which writes the build's values there and shows the diff."""

import difflib
import itertools
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass

from bookbuild.common import NUMBERS, fail, module_constant
from bookbuild.execute import Glued, glued_values

KINDS = module_constant("KINDS")  # exact close seeded measured recorded
#: relative tolerance where numbers.toml gives none
DEFAULT_TOL = {"close": 1e-9, "seeded": 1e-6}
#: The releases the build runs on: unset for the pins; "newest" weekly;
#: "lowest" or "colab" in `make compat`. Off the pins, a key naming the
#: torch or transformers release (RELEASE_KEY) must be a version.
RELEASES = "WHY_SELF_ATTENTION_RELEASES"
RELEASE_KEY = re.compile(r"(^|_)(transformers|torch)_version$")
FIELDS = ("kind", "value", "values", "threshold", "tol", "published",
          "meaning")


def load_expected(path=NUMBERS) -> dict[str, dict[str, dict]]:
    """numbers.toml: {page: {key: {kind, value, ...}}}."""
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    for page, keys in data.items():
        for key, entry in keys.items():
            if entry.get("kind") not in KINDS:
                fail(f"numbers.toml [{page}] {key}: kind must be one of "
                     f"{KINDS}, got {entry.get('kind')!r}")
    return data


def dump_expected(data: dict[str, dict[str, dict]], header: str) -> str:
    """numbers.toml's text: the header, a table a page, a line a key in
    the order glued (TOML's strings, numbers and arrays are JSON's)."""
    def name(key: str) -> str:
        return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(
            key, ensure_ascii=False)
    lines = [header.rstrip("\n")]
    for page in sorted(data):
        lines += ["", f"[{name(page)}]"]
        for key, entry in data[page].items():
            fields = ", ".join(
                f"{f} = {json.dumps(entry[f], ensure_ascii=False)}"
                for f in FIELDS if entry.get(f) is not None)
            lines.append(f"{name(key)} = {{ {fields} }}")
    return "\n".join(lines) + "\n"


@dataclass
class Problem:
    """One row of the drift table."""
    page: str
    key: str
    kind: str
    expected: object
    got: object
    reason: str
    margin: str = ""          # a claim's "ratio / threshold"


def significant(text: str) -> int:
    """Significant digits of a printed number: '0.133' → 3."""
    mantissa = text.lower().split("e")[0].replace("-", "").replace(
        ".", "").lstrip("0")
    return max(1, len(mantissa) if "." in text
               else len(mantissa.rstrip("0")))


def agrees_with_published(value, published) -> bool:
    """The value, rounded as the companion articles round it, gives the
    number they print."""
    if isinstance(published, (bool, str)) or isinstance(value, (
            bool, str)) or isinstance(published, int) and isinstance(
                value, int):
        return value == published
    digits = significant(repr(published))
    return (float(f"{float(value):.{digits}g}")
            == float(f"{float(published):.{digits}g}"))


def is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def claim_margin(glued: Glued | None) -> str:
    """A claim's ratio / threshold = margin, as the tables show it."""
    if glued is None or glued.margin is None:
        return ""
    return f"{glued.ratio:.3g} / {glued.threshold:.3g} = {glued.margin:.2f}"


def compare_one(page: str, key: str, entry: dict, value,
                glued: Glued | None = None) -> Problem | None:
    """One glued value against its expectation, or its problem."""
    kind, expected = entry["kind"], entry.get("value")

    def problem(reason: str) -> Problem:
        return Problem(page, key, kind, expected, value, reason,
                       claim_margin(glued))
    if glued is not None and glued.stated and glued.kind != kind:
        return problem(f"glued as {glued.kind}, numbers.toml says {kind}: "
                       "change one of them (`make numbers` takes the "
                       "notebook's)")
    if (RELEASE_KEY.search(key)
            and os.getenv(RELEASES, "pinned") != "pinned"):
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?\S*", str(value)):
            return problem("not a version string")
        return None
    if kind in ("measured", "recorded"):
        allowed = entry.get("values")
        if glued is not None and glued.values and (
                sorted(glued.values) != sorted(allowed or [])):
            return problem("the phrases it may take differ from `values`")
        if allowed is not None:
            return (None if value in allowed
                    else problem(f"a phrase must be one of {allowed}"))
        # a span as printed, "5.9 to 9.1" or "6.0": a measured range
        if not (is_number(value) or isinstance(value, str) and re.fullmatch(
                r"[\d.,]+( to [\d.,]+)?", value)):
            return problem(f"a {kind} value must be a finite number or a "
                           "span such as '5.9 to 9.1' (a phrase needs "
                           "`values`)")
        return None
    if kind == "exact":
        if type(value) is not type(expected) or value != expected:
            return problem("drifted")
    elif not (is_number(value) and is_number(expected)):
        return problem("not a number")
    else:
        tol = entry.get("tol") or DEFAULT_TOL[kind]
        if not math.isclose(value, expected, rel_tol=tol,
                            abs_tol=tol * 1e-12):
            return problem(f"drifted beyond rel. tol {tol:g}")
    threshold = entry.get("threshold")
    if threshold is not None and (glued is None
                                  or glued.threshold != threshold):
        got = getattr(glued, "threshold", None)
        return problem(f"a claim with threshold {threshold:g} in "
                       "numbers.toml, glued with "
                       + ("none" if got is None else f"{got:g}"))
    published = entry.get("published")
    if (published is not None and kind in ("exact", "close")
            and not agrees_with_published(value, published)):
        return Problem(page, key, kind, published, value,
                       "disagrees with the companion articles")
    return None


def compare(expected: dict[str, dict[str, dict]],
            glued: dict[str, dict[str, Glued]]) -> list[Problem]:
    """Every drift, missing key and glued key without an expectation."""
    problems = []
    for page in sorted(set(expected) | set(glued)):
        want, have = expected.get(page, {}), glued.get(page)
        if have is None:
            problems.append(Problem(page, "*", "-", f"{len(want)} keys",
                                    None, "page not executed"))
            continue
        for key, entry in want.items():
            if key not in have:
                problems.append(Problem(
                    page, key, entry["kind"], entry.get("value"), None,
                    "missing: expected but not glued"))
            elif found := compare_one(page, key, entry, have[key].value,
                                      have[key]):
                problems.append(found)
        problems += [Problem(page, key, "-", None, have[key].value,
                             "unexpected: glued but not in numbers.toml "
                             "(run `make numbers`)")
                     for key in have if key not in want]
    return problems


def fmt(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return f"{value:.10g}" if isinstance(value, float) else str(value)


def problem_table(problems: list[Problem]) -> str:
    """The drift table, a row a problem, for a terminal."""
    import pandas as pd

    rows = [(p.page, p.key, p.kind, fmt(p.expected), fmt(p.got),
             p.margin or "—", p.reason) for p in problems]
    columns = ["page", "key", "kind", "expected", "got",
               "ratio / threshold", "what"]
    return pd.DataFrame(rows, columns=columns).to_string(index=False)


def check_numbers(only: list[str] | None = None,
                  glued: dict | None = None) -> None:
    """The build's glued values against numbers.toml; a failure shows
    the table of every problem."""
    glued = glued if glued is not None else glued_values(only)
    expected = {page: keys for page, keys in load_expected().items()
                if not only or page in only}
    problems = compare(expected, glued)
    total = sum(len(keys) for keys in glued.values())
    if problems:
        fail(f"number check: {len(problems)} problem(s) in {total} glued "
             f"values\n{problem_table(problems)}\nIf a change is on "
             "purpose, run `make numbers`, read the diff, and say so in "
             "the commit.")
    print(f"numbers: {total} glued values on {len(glued)} pages match "
          "numbers.toml")
    if os.getenv(RELEASES, "pinned") != "pinned":
        print(f"  ({RELEASES}={os.environ[RELEASES]}: the release names "
              "were checked to be versions, not compared with the pins)")


def accept_numbers(only: list[str] | None = None) -> None:
    """Write the build's glued values into numbers.toml, keeping kinds,
    published values and meanings; print the diff."""
    old = load_expected()
    new = {page: keys for page, keys in old.items()
           if only and page not in only}
    for page, keys in glued_values(only).items():
        new[page] = {}
        for key, glued in keys.items():
            entry = dict(old.get(page, {}).get(key, {}))
            if glued.stated or "kind" not in entry:   # the notebook's
                entry["kind"] = glued.kind
            if glued.tol is not None:
                entry.setdefault("tol", glued.tol)
            entry.update({f: getattr(glued, f) for f in ("values",
                          "threshold") if getattr(glued, f) is not None})
            new[page][key] = {**entry, "value": glued.value}
    before = NUMBERS.read_text(encoding="utf-8") if NUMBERS.exists() else ""
    header = "".join(itertools.takewhile(
        lambda line: line.startswith("#"), before.splitlines(True)))
    after = dump_expected(new, header)
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(),
                                "numbers.toml (before)",
                                "numbers.toml (after)", lineterm="")
    try:                             # never write a file TOML rejects
        tomllib.loads(after)
    except tomllib.TOMLDecodeError as error:
        fail(f"numbers.toml would not be valid TOML ({error}): a glued "
             "value is NaN, infinite or None; nothing was written")
    NUMBERS.write_text(after, encoding="utf-8")
    print("\n".join(diff) or "numbers.toml: no change")
