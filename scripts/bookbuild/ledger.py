"""Stage 4, the generated pages: book/ledger.md (every checked number,
its expectation and this build's value) and book/exercises.md (every
exercise of every part, its question and a link to it)."""

import html
import re
from pathlib import Path

from bookbuild import common, numbers
from bookbuild.common import EXERCISES, LEDGER, rel
from bookbuild.execute import Glued, glued_values

#: the two pages' titles and introductions ({claims} filled in)
LEDGER_INTRO = Path(__file__).with_name("ledger_intro.md")
EXERCISES_INTRO = Path(__file__).with_name("exercises_intro.md")
COLUMNS = ("key", "meaning", "kind", "tolerance (this build vs expected)",
           "published", "this build", "ratio / threshold", "status")
ALIGN = "left", "left", "left", "right", "right", "right", "right", "left"
EXERCISE = re.compile(r"^```\{exercise\}[ \t]*(?P<title>.*?)[ \t]*\n"
                      r":label:\s*(?P<label>\S+)\n(?P<body>.*?)^```$",
                      re.M | re.S)


def ledger_text(expected: dict[str, dict[str, dict]],
                glued: dict[str, dict[str, Glued]]) -> str:
    """The ledger: a table a page (class `ledger`: the PDF prints it
    small), a row a checked number; HTML, which Sphinx passes through (as
    Markdown, its 2,000 rows took 8 of the site's 20 s to parse)."""
    def row(cells, tag: str = "td") -> str:
        cells = [html.escape(str(c)) for c in cells]
        if tag == "td":
            cells[0] = f"<code>{cells[0]}</code>"      # the key
        return "<tr>" + "".join(f'<{tag} class="text-{a}">{c}</{tag}>'
                                for a, c in zip(ALIGN, cells)) + "</tr>"
    problems = {(p.page, p.key): p.reason
                for p in numbers.compare(expected, glued)}
    margins = [g.margin for keys in glued.values() for g in keys.values()
               if g.margin is not None]
    claims = (f"{len(margins)} claims, {sum(m < 2 for m in margins)} of "
              "them with a margin under 2" if margins else "no claims")
    lines = [LEDGER_INTRO.read_text(encoding="utf-8").format(
        claims=claims).rstrip("\n")]
    for page in sorted(expected):
        rows = []
        for key, entry in expected[page].items():
            kind, have = entry["kind"], glued.get(page, {}).get(key)
            tol = entry.get("tol") or numbers.DEFAULT_TOL.get(kind)
            status = problems.get((page, key), "ok")
            margin = numbers.claim_margin(have)
            if margin and have.margin < 2:
                margin = "⚠ " + margin
            parts = key.split(".")      # a table's cell: name.row.column
            meaning = entry.get("meaning") or (
                f"table {parts[0]}, row {parts[1]}, column "
                f"{parts[2].replace('_', ' ')}" if len(parts) == 3 else "")
            rows.append(row([
                key, meaning, kind, f"{tol:g}" if tol else "—",
                numbers.fmt(entry.get("published")),
                numbers.fmt(have.value if have else None), margin or "—",
                "✅ ok" if status == "ok" else f"❌ {status}"]))
        lines += ["", f"## [{page}](../notebooks/{page}.md)", "",
                  "```{raw} html", '<div class="pst-scrollable-table-'
                  'container"><table class="ledger table">',
                  f"<thead>{row(COLUMNS, 'th')}</thead><tbody>", *rows,
                  "</tbody></table></div>", "```"]
    return "\n".join(lines) + "\n"


def write_ledger(glued: dict | None = None) -> None:
    glued = glued if glued is not None else glued_values()
    text = ledger_text(numbers.load_expected(), glued)
    print(f"ledger: {rel(LEDGER)} {common.write_if_changed(LEDGER, text)}")


def page_title(md: Path) -> str:
    """A notebook's first heading outside code cells (a `# ` line in a
    code cell is a comment, such as the Colab cell's first line)."""
    text = "\n".join(c.source for c in common.read_md(md).cells
                     if c.cell_type == "markdown")
    found = re.search(r"^#\s+(\S.*)$", text, re.M)
    return found[1].strip() if found else md.stem


def exercises_text() -> str:
    """Each part's exercises under its title: a link to each, its title
    and its question."""
    lines = [EXERCISES_INTRO.read_text(encoding="utf-8")]
    for md in common.notebook_sources():
        found = list(EXERCISE.finditer(md.read_text(encoding="utf-8")))
        if found:
            lines += [f"## [{page_title(md)}](../notebooks/{md.stem}.md)",
                      ""]
        for m in found:
            lines.append(f"- {{numref}}`{m['label']}`"
                         + (f": {m['title']}" if m["title"] else ""))
            body = m["body"].strip().splitlines()
            lines += ["", *(f"  {line}".rstrip() for line in body), ""]
    return "\n".join(lines)


def write_exercises() -> None:
    print(f"exercises: {rel(EXERCISES)} "
          f"{common.write_if_changed(EXERCISES, exercises_text())}")
