"""No output of the built site is cut short: pandas prints a table in part when it is wider or
longer than its display options allow, with "..." for the columns or rows it leaves out and a
line "[N rows x M columns]" (in HTML, "N rows × M columns"). A reader then cannot see the column
the prose talks about. Read from the HTML files (no browser); the width of each output is the
browser test's (tests/site/test_site_browser.py).
SKIPS without _build/html (run `make book`); with --require-site (.ci/run) that is a failure.
"""

from __future__ import annotations

import pandas as pd

import sitekit


def test_no_output_is_cut_short_by_pandas(site):
    pages = [page for page in sitekit.html_pages(site) if page.startswith("notebooks/")]
    assert pages, "the site has no notebook page"
    problems = sitekit.truncated_outputs(site, pages)
    assert not problems, f"{len(problems)} output(s) cut short:\n" + "\n".join(problems)


# ── the check catches pandas' own truncation, in a small crafted site ─────────────────────

CELL = ('<div class="cell docutils container"><div class="cell_input docutils container">'
        '<pre>{code}</pre></div><div class="cell_output docutils container">{output}</div>'
        '</div>')


def crafted_site(tmp_path, outputs: dict[str, str]):
    """A site of one notebook page whose cells print `outputs` (first line of code → output)."""
    cells = "".join(CELL.format(code=code, output=output) for code, output in outputs.items())
    page = tmp_path / "notebooks" / "crafted.html"
    page.parent.mkdir(parents=True)
    page.write_text(f"<html><body><main>{cells}</main></body></html>", encoding="utf-8")
    return tmp_path


def test_pandas_truncation_is_caught_in_text_and_html(tmp_path):
    wide = pd.DataFrame([[1.5] * 30] * 80, columns=[f"column {i}" for i in range(30)])
    with pd.option_context("display.max_columns", 6, "display.max_rows", 10,
                           "display.width", 76):
        text, html = repr(wide), wide._repr_html_()
    site = crafted_site(tmp_path, {"wide": f"<pre>{text}</pre>",
                                   "wide_html": f'<div class="output text_html">{html}</div>',
                                   "narrow": f"<pre>{wide.iloc[:3, :3].to_string()}</pre>",
                                   "prose": "<pre>inputs 0 … n-1 and a, b, ... too</pre>"})
    problems = sitekit.truncated_outputs(site, ["notebooks/crafted.html"])
    text_cell = [p for p in problems if "cell 1 ('wide')" in p]
    html_cell = [p for p in problems if "cell 2 ('wide_html')" in p]
    assert any("'[80 rows x 30 columns]'" in p for p in text_cell), problems
    assert any("'...' in" in p for p in text_cell), problems
    assert any("a cell '...'" in p for p in html_cell), problems
    assert any("80 rows × 30 columns" in p for p in html_cell), problems
    assert not [p for p in problems if "cell 3" in p or "cell 4" in p], problems
