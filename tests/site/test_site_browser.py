"""The book as readers meet it: every page of _build/html opened in a real headless Chromium.

For every page: no console error, every image loaded, every glued number of its source shown,
the Colab/Binder buttons open an .ipynb of the repository, the download button a notebook the
site holds; every formula typeset by MathJax (served by the site itself), no raw TeX shown;
no request to anything but the site (Chrome's own record of the page's network requests);
no critical or serious accessibility violation (axe-core, in the same browser session); no code
cell and no output (printed text or table, collapsed ones opened) wider than the column at
1,280 px, each named by its page and its cell.
Then: search finds pages, and figures stay on a light background in the dark theme.
Screenshots go to _build/screenshots/ (light for every page, dark for the notebook pages), taken
once MathJax has typeset the page; axe-core's findings, by page and impact, to _build/axe.json.

The test serves the site itself on 127.0.0.1 (a free port) and starts Chromium itself (Debian's
chromium + chromium-driver; nothing is downloaded). It SKIPS without _build/html (run `make book`)
or without chromium; with --require-site (.ci/run, after `make book`) both are failures.
The last tests break a copy of the site on purpose, and add small crafted pages to it (a page
without MathJax, an image from another host, inaccessible citation markup), and check that the
same checks catch each.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import sitekit
from bookbuild import common, execute
from bookbuild.pdf import BROWSER_FLAGS, CHROMIUM  # noqa: E402  (one browser set-up for the book)
from sitekit import HTML, ROOT, SCREENSHOTS, Server

CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"     # Debian's, for Selenium
FLAGS = BROWSER_FLAGS + ["--window-size=1280,900"]
LOAD_TIMEOUT = 30        # seconds for one page
SEARCH_TIMEOUT = 20      # seconds for the search page to list its results
MAX_SHOT_HEIGHT = 16000  # pixels of a full-page screenshot (Chromium's limit is near 16,384)
LIGHT = 0.6              # least luminance (0 black … 1 white) of a figure's corner in dark mode
MATH_TIMEOUT = 30        # seconds for MathJax to typeset a page
AXE_TIMEOUT = 100        # seconds for axe-core on one page (the ledger's 5,500 cells take ~35 s)
# resultTypes: list violations only (4× faster on the ledger: passes are not listed).
# preload: no CSSOM fetch. axe-core 4.9.1 resolves the theme's `@import "../basic.css"` (in
# _static/styles/theme.css) against the page's URL, not the stylesheet's, and requests a file that
# does not exist (a 404 in the console); only css-orientation-lock reads the CSSOM.
AXE_OPTIONS = json.dumps({"resultTypes": ["violations"], "preload": False})
# color-contrast is most of axe-core's time (25 of the ledger's ~30 s: its 2,062 rows, 16,500
# cells). A page with at least REPEATED_ROWS table rows that repeat an earlier row's markup
# (see REPEATED_ROWS_JS) has every other rule run on the whole page, and color-contrast on the
# page less those rows: a row with the same elements, classes, inline styles, text-or-not and
# stripe (odd or even) as a row kept has the same colours, so the same contrast verdict.
AXE_ALL_BUT_CONTRAST = json.dumps({"resultTypes": ["violations"], "preload": False,
                                   "rules": {"color-contrast": {"enabled": False}}})
AXE_CONTRAST = json.dumps({"resultTypes": ["violations"], "preload": False,
                           "runOnly": {"type": "rule", "values": ["color-contrast"]}})
REPEATED_ROWS = 200
AXE_REPORT = sitekit.ROOT / "_build" / "axe.json"
ASPECTS = ("console", "images", "glue", "launch", "download", "math", "network", "axe", "scroll",
           "outputs")


# ── the browser ───────────────────────────────────────────────────────────────────────────


@pytest.fixture(scope="session")
def browser(request):
    """Headless Chromium driven through Debian's chromedriver, with a fresh profile."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not Path(path).exists()]
    if missing:
        sitekit.skip_or_fail(request.config, f"no {' or '.join(missing)}: install Debian's "
                             f"chromium and chromium-driver (apt-get install chromium "
                             f"chromium-driver) to run the browser test")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        sitekit.skip_or_fail(request.config, "selenium is not installed (requirements.txt pins it)")
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    # "performance": the DevTools Network events, i.e. every request the browser makes.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    options.add_experimental_option("perfLoggingPrefs", {"enableNetwork": True,
                                                         "enablePage": False})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(LOAD_TIMEOUT)
    driver.set_script_timeout(AXE_TIMEOUT)
    driver.get("about:blank")          # off the browser's start page (its requests are not ours)
    driver.get_log("performance")
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@dataclass
class Site:
    """A built site being served: its folder, its URL, the checkout it came from, its glue."""
    html: Path
    url: str
    root: Path
    glued: dict
    pages: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def site(request):
    """The fresh site of `make book`, served on 127.0.0.1 for the length of this module."""
    sitekit.fresh_site_or_skip(request.config)
    try:
        glued = execute.glued_values()
    except common.BuildError as error:
        sitekit.skip_or_fail(request.config, f"the build's glued values cannot be read: {error}")
    with Server(HTML) as server:
        yield Site(HTML, server.url, ROOT, glued, sitekit.html_pages(HTML))


# ── one page ──────────────────────────────────────────────────────────────────────────────


def wait_loaded(driver) -> None:
    """Wait for the load event (images included)."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, LOAD_TIMEOUT).until(
        lambda d: d.execute_script("return document.readyState") == "complete")


def attributes(driver, selector: str, attribute: str) -> list[str]:
    """An attribute, as written in the HTML, of every element a CSS selector finds."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]))"
        ".map(e => e.getAttribute(arguments[1]))", selector, attribute)


MATHJAX_DONE = """
const done = arguments[arguments.length - 1];
const mathjax = window.MathJax;     // before MathJax loads: only the page's configuration object
if (!mathjax || !mathjax.startup || !mathjax.startup.promise) { done("no MathJax"); return; }
mathjax.startup.promise.then(() => done("typeset"), error => done("MathJax failed: " + error));
"""

MATH_STATE = """
const main = document.querySelector("main") || document.body;
const math = Array.from(main.querySelectorAll(".math"));
const prose = main.cloneNode(true);  // what a reader sees as text, less code and MathJax's MathML
prose.querySelectorAll("code, pre, script, style, mjx-assistive-mml").forEach(e => e.remove());
return {
  text: prose.textContent,
  untypeset: math.filter(e => !e.querySelector("mjx-container")).map(e => e.textContent),
  errors: Array.from(main.querySelectorAll("mjx-merror"))
    .map(e => e.getAttribute("data-mjx-error") || e.textContent),
  typeset: main.querySelectorAll("mjx-container").length,
};
"""


def wait_typeset(driver) -> str:
    """Wait until MathJax has typeset the page (its startup promise); say how it ended."""
    from selenium.common.exceptions import TimeoutException

    driver.set_script_timeout(MATH_TIMEOUT)
    try:
        return driver.execute_async_script(MATHJAX_DONE)
    except TimeoutException:
        return f"MathJax did not finish in {MATH_TIMEOUT} s"
    finally:
        driver.set_script_timeout(AXE_TIMEOUT)


def math_check(driver, page: str, state: str) -> tuple[list[str], int]:
    """Raw TeX left on the page, and how many formulas MathJax typeset."""
    seen = driver.execute_script(MATH_STATE)
    problems = sitekit.raw_tex_problems(page, seen["text"], seen["untypeset"], seen["errors"])
    if problems and state != "typeset":
        problems.append(f"{page}: {state}")
    return problems, seen["typeset"]


#: Marks the table rows whose markup repeats an earlier row of the page (window.__axeRepeated);
#: how many. A row's signature: its table's, its own and each element's tag, classes and inline
#: style, and whether it holds text of its own. Rows go by pairs, so that a row kept keeps its
#: stripe (the theme's zebra is nth-child(odd) / (2n)): a pair stays if either row is new.
REPEATED_ROWS_JS = """
const seen = new Set(), repeated = [];
const own = e => Array.from(e.childNodes).some(n => n.nodeType === 3 && n.textContent.trim());
const sign = e => [e.tagName, e.className, e.getAttribute('style') || '', own(e)].join(' ');
document.querySelectorAll('tbody').forEach(tbody => {
  const rows = Array.from(tbody.children).filter(row => row.tagName === 'TR');
  const kept = new Set();
  rows.forEach((row, i) => {
    const key = [i % 2, sign(tbody.closest('table') || tbody), sign(row),
                 ...Array.from(row.querySelectorAll('*'), sign)].join('|');
    if (!seen.has(key)) { seen.add(key); kept.add(i - i % 2); }
  });
  rows.forEach((row, i) => { if (!kept.has(i - i % 2)) repeated.push(row); });
});
window.__axeRepeated = repeated;
return repeated.length;
"""
#: Takes the repeated rows out of the page, and puts them back where they were.
DETACH_REPEATED_JS = """
window.__axeDetached = window.__axeRepeated.map(row => [row, row.parentNode, row.nextSibling]);
window.__axeDetached.forEach(([row]) => row.remove());
"""
RESTORE_REPEATED_JS = """
(window.__axeDetached || []).reverse()
  .forEach(([row, parent, next]) => parent.insertBefore(row, next));
delete window.__axeDetached; delete window.__axeRepeated;
"""


def axe_check(driver, page: str) -> tuple[list[str], dict]:
    """axe-core on the page as it is now: the failing violations, and a summary of all.
    A page of many repeated table rows: color-contrast without the repeats (AXE_CONTRAST)."""
    from selenium.common.exceptions import TimeoutException
    from selenium_axe_python import Axe

    axe = Axe(driver)
    axe.inject()
    try:
        if driver.execute_script(REPEATED_ROWS_JS) < REPEATED_ROWS:
            results = axe.run(options=AXE_OPTIONS)
        else:
            results = axe.run(options=AXE_ALL_BUT_CONTRAST)
            driver.execute_script(DETACH_REPEATED_JS)
            try:
                contrast = axe.run(options=AXE_CONTRAST)
            finally:
                driver.execute_script(RESTORE_REPEATED_JS)
            results = {"violations": results.get("violations", [])
                       + contrast.get("violations", [])}
    except TimeoutException:
        return [f"{page}: axe-core did not finish in {AXE_TIMEOUT} s"], {}
    summary = {"counts": sitekit.axe_counts(results),
               "violations": [{"rule": v["id"], "impact": v["impact"], "help": v["help"],
                               "elements": len(v["nodes"]),
                               "targets": [" ".join(map(str, n["target"])) for n in v["nodes"][:5]]}
                              for v in results.get("violations", [])]}
    return sitekit.axe_problems(page, results), summary


def visit(driver, site: Site, page: str, shot: Path | None = None,
          axe: bool = True) -> dict[str, list[str]]:
    """Open one page and check it; the problems found, by aspect (see ASPECTS). With `shot`,
    a full-page screenshot once the math is typeset. Also: "typeset" (formulas typeset) and
    "axe summary" (axe-core's violations of any impact). axe=False: no axe-core (its slowest
    check, 4 to 35 s a page), for a copy of a page whose axe findings no test reads."""
    url = f"{site.url}/{page}"
    driver.get_log("performance")      # drop what came before: only this page's requests count
    driver.get(url)
    wait_loaded(driver)
    state = wait_typeset(driver)
    found = {aspect: [] for aspect in ASPECTS} | {"axe summary": {}}
    found["math"], found["typeset"] = math_check(driver, page, state)
    found["console"] = sitekit.console_problems(page, driver.get_log("browser"), site.url)
    images = driver.execute_script(
        "return Array.from(document.images).map(i => [i.getAttribute('src'), i.complete,"
        " i.naturalWidth])")
    for src, complete, width in images:
        if not complete or not width:
            found["images"].append(f"{page}: image {src} did not load")
    source = sitekit.source_of(page, site.root)
    if source is not None:
        figures = [s for s, _, width in images if "_images/" in (s or "") and width]
        wanted = sitekit.figure_cells(source) if sitekit.is_notebook_page(page, site.root) else 0
        if len(figures) < wanted:
            found["images"].append(f"{page}: {wanted} figure cells in {source.name}, "
                                   f"{len(figures)} figures on the page")
        found["glue"] = glue_check(driver, site, page, source)
    hrefs = attributes(driver, "a[href]", "href")
    found["launch"] = sitekit.launch_problems(page, hrefs, site.root)
    if sitekit.is_notebook_page(page, site.root):
        found["download"] = sitekit.download_problems(page, url, hrefs, site.html, site.url)
    if axe:
        found["axe"], found["axe summary"] = axe_check(driver, page)
    if shot is not None:
        screenshot(driver, shot, full_page=True)
    found["network"] = sitekit.offsite_requests(page, driver.get_log("performance"), site.url)
    found["scroll"] = scroll_check(driver, page)         # last: it opens the collapsed cells
    found["outputs"] = output_check(driver, page)        # and the collapsed solutions
    return found


#: Every collapsed cell opened (a reader expands "Show code"), then each code cell's source
#: measured: wider than its box means a sideways scroll bar. (first line, scroll, client width)
WIDE_CELLS = """
document.querySelectorAll('details').forEach(d => { d.open = true; });
return Array.from(document.querySelectorAll('div.cell_input pre'))
  .filter(pre => pre.scrollWidth > pre.clientWidth)
  .map(pre => [pre.textContent.split('\\n')[0], pre.scrollWidth, pre.clientWidth]);
"""


def scroll_check(driver, page: str) -> list[str]:
    """Every code cell a reader can see (those under "Show code" opened) fits its column at the
    window's width (1,280 px): none needs a sideways scroll bar. Names the cell's first line."""
    return [f"{page}: a code cell scrolls sideways ({wide} px in {shown} px), first line "
            f"{first.strip()[:70]!r}" for first, wide, shown in driver.execute_script(WIDE_CELLS)]


#: Every collapsed cell and dropdown opened (a reader expands "Show code", "Show output" and each
#: solution), then each output a reader sees measured: its printed text, or the box that holds a
#: table or an image, wider than the column means a sideways scroll bar or content cut off.
#: (cell number on the page, its first code line or "", scroll width, client width, first line)
WIDE_OUTPUTS = """
document.querySelectorAll('details').forEach(d => { d.open = true; });
document.querySelectorAll('button.toggle-button-hidden').forEach(b => b.click());
const wide = [];
document.querySelectorAll('div.cell').forEach((cell, number) => {
  const code = cell.querySelector('div.cell_input pre');
  const first = code ? code.textContent.split('\\n')[0] : '';
  cell.querySelectorAll('div.cell_output pre, div.cell_output div.output').forEach(out => {
    if (out.scrollWidth > out.clientWidth + 1 && !out.querySelector('pre')) {
      const row = out.querySelector('table tr');      // a table: its header row
      const text = row ? Array.from(row.cells).map(c => c.textContent.trim()).join(' ')
                       : out.textContent.trim().split('\\n')[0];
      wide.push([number + 1, first, out.scrollWidth, out.clientWidth, text]);
    }
  });
});
return wide;
"""


def output_check(driver, page: str) -> list[str]:
    """Every output a reader can see (under "Show code", "Show output" and in the solutions,
    opened) fits its column at the window's width (1,280 px), as code cells do: no printed text
    or table wider than the page. Names the page, the cell (its number among the cells the page
    shows, and its first line of code if shown) and the output's first line (a table's header)."""
    return [f"{page}: the output of cell {number}"
            + (f" ({first.strip()[:50]!r})" if first.strip() else " (its code hidden)")
            + f" is wider than the column ({wide} px in {shown} px), starting "
            f"{text.strip()[:50]!r}"
            for number, first, wide, shown, text in driver.execute_script(WIDE_OUTPUTS)]


def glue_check(driver, site: Site, page: str, source: Path) -> list[str]:
    """Every {glue:text} of the page's source is pasted with its formatted value; none is left raw."""
    expected, problems = sitekit.expected_pasted(source, page, site.glued)
    pasted = driver.execute_script(
        "return Array.from(document.querySelectorAll('span.pasted-text')).map(e => e.textContent)")
    problems += sitekit.glue_problems(page, pasted, expected)
    text = driver.execute_script(      # the page's prose: code may show a role on purpose
        "const main = (document.querySelector('main') || document.body).cloneNode(true);"
        "main.querySelectorAll('code, pre').forEach(e => e.remove()); return main.textContent")
    if "{glue" in text or driver.find_elements("css selector", ".problematic"):
        problems.append(f"{page}: an unresolved glue role or reference is shown as raw text")
    return problems


def screenshot(driver, path: Path, full_page: bool) -> None:
    """Save the whole page (or the window) as PNG."""
    import base64

    path.parent.mkdir(parents=True, exist_ok=True)
    if not full_page:
        driver.save_screenshot(str(path))
        return
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "scale": 1,
            "height": min(size["height"], MAX_SHOT_HEIGHT)}
    shot = driver.execute_cdp_cmd("Page.captureScreenshot",
                                  {"format": "png", "captureBeyondViewport": True, "clip": clip,
                                   "optimizeForSpeed": True})
    path.write_bytes(base64.b64decode(shot["data"]))


def shot_name(page: str, suffix: str = "") -> str:
    """notebooks/01_costs.html → notebooks__01_costs.png."""
    return page.removesuffix(".html").replace("/", "__") + suffix + ".png"


def luminance(rgb) -> float:
    """Relative luminance of an sRGB colour, 0 (black) to 1 (white), without gamma: enough here."""
    r, g, b = rgb[:3]
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


def corners(image) -> list[tuple]:
    """The four corner pixels of a Pillow image, 2 pixels in (past any border)."""
    w, h = image.size
    return [image.getpixel((x, y)) for x in (2, w - 3) for y in (2, h - 3)]


def set_theme(driver, mode: str) -> None:
    """Choose the theme as the theme's own switch does (localStorage), then reload."""
    driver.execute_script("localStorage.setItem('mode', arguments[0]);"
                          "localStorage.setItem('theme', arguments[0]);", mode)
    driver.refresh()
    wait_loaded(driver)
    wait_typeset(driver)


def dark_problems(driver, site: Site, page: str) -> list[str]:
    """In the dark theme (already chosen), each figure keeps a light background around its lines."""
    from PIL import Image

    driver.get(f"{site.url}/{page}")
    wait_loaded(driver)
    wait_typeset(driver)
    problems = []
    theme = driver.execute_script("return document.documentElement.dataset.theme")
    body = driver.execute_script("return getComputedStyle(document.body).backgroundColor")
    rgb = [int(v) for v in re.findall(r"\d+", body)[:3]]
    if theme != "dark" or luminance(rgb) > 0.3:
        problems.append(f"{page}: the dark theme did not apply (theme {theme}, body {body})")
    figures = driver.find_elements("css selector", "img[src*='_images/']")
    for figure in figures:            # what the reader sees: the figure as drawn on the screen,
        # in the middle of the window, clear of the sticky (dark) header
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", figure)
        seen = Image.open(io.BytesIO(figure.screenshot_as_png)).convert("RGB")
        darkest = min(luminance(pixel) for pixel in corners(seen))
        if darkest < LIGHT:
            problems.append(f"{page}: figure {figure.get_attribute('src')} shows a dark "
                            f"background in the dark theme (corner luminance {darkest:.2f})")
    if figures:
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", figures[0])
    screenshot(driver, SCREENSHOTS / shot_name(page, "-dark"), full_page=False)
    return problems


# ── the tests of the site ─────────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def visits(browser, site):
    """Every page opened once in the light theme, with a full-page screenshot of each; axe-core's
    findings written to _build/axe.json (by page: elements by impact, and each rule broken)."""
    if SCREENSHOTS.exists():
        shutil.rmtree(SCREENSHOTS)
    found = {}
    for page in site.pages:
        found[page] = visit(browser, site, page, shot=SCREENSHOTS / shot_name(page))
    summaries = {page: f["axe summary"] for page, f in found.items()}
    totals = {impact: sum(s.get("counts", {}).get(impact, 0) for s in summaries.values())
              for impact in sitekit.IMPACTS}
    AXE_REPORT.write_text(json.dumps({"axe-core": axe_version(browser), "elements by impact": totals,
                                      "pages": summaries}, indent=1), encoding="utf-8")
    return found


def axe_version(driver) -> str:
    """The version of axe-core injected into the current page."""
    return driver.execute_script("return window.axe ? axe.version : null") or "?"


def report(visits: dict, aspect: str) -> list[str]:
    """Every problem of one aspect, on every page."""
    return [problem for found in visits.values() for problem in found[aspect]]


def test_the_site_has_a_page_per_notebook(site):
    have = {page for page in site.pages if page.startswith("notebooks/")}
    want = {f"notebooks/{stem}.html" for stem in sitekit.notebook_stems(site.root)}
    assert want and want <= have, f"notebooks without a page: {sorted(want - have)}"


@pytest.mark.parametrize("aspect", ASPECTS)
def test_every_page(visits, aspect):
    problems = report(visits, aspect)
    assert not problems, f"{len(problems)} problem(s) with {aspect}:\n" + "\n".join(problems)


def test_every_page_was_checked(visits, site):
    """The checks saw glue, figures and notebooks: a test that checks nothing passes nothing."""
    notebook_pages = [p for p in site.pages if sitekit.is_notebook_page(p, site.root)]
    assert notebook_pages and set(notebook_pages) <= set(visits)
    glued_pages = [p for p in notebook_pages if sitekit.glue_roles(
        sitekit.source_of(p, site.root).read_text(encoding="utf-8"))]
    assert glued_pages, "no notebook page pastes a glued number"
    shots = {p.name for p in SCREENSHOTS.glob("*.png")}
    assert {shot_name(page) for page in site.pages} <= shots
    typeset = {page: visits[page]["typeset"] for page in site.pages if visits[page]["typeset"]}
    assert len(typeset) >= 3, f"MathJax typeset formulas on too few pages: {typeset}"
    assert all(visits[page]["axe summary"].get("counts") for page in site.pages), \
        "axe-core did not report on every page"


def test_search_finds_pages(browser, site):
    """search.html?q=attention lists results, each a page of the site, a notebook among them."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{site.url}/search.html?q=attention")
    results = "#search-results ul.search li a"
    # Sphinx lists results one by one and writes its summary ("Search finished, ...") last
    WebDriverWait(browser, SEARCH_TIMEOUT).until(lambda d: d.execute_script(
        "const p = document.querySelector('#search-results p.search-summary');"
        "return p !== null && p.innerText.trim().length > 0"))
    hrefs = attributes(browser, results, "href")
    missing = [h for h in hrefs if not (site.html / h.split("#")[0].split("?")[0]).is_file()]
    assert not missing, f"search results name pages the site lacks: {missing}"
    assert any(h.startswith("notebooks/") for h in hrefs), f"no notebook among {hrefs}"
    assert not sitekit.console_problems("search.html", browser.get_log("browser"), site.url)
    screenshot(browser, SCREENSHOTS / "search.png", full_page=False)


def test_figures_are_readable_in_the_dark_theme(browser, site, visits):
    """Each notebook page in the dark theme; figures keep their light background."""
    pages = [page for page in site.pages if sitekit.is_notebook_page(page, site.root)]
    assert pages, "no notebook page to look at"
    browser.get(f"{site.url}/{pages[0]}")
    set_theme(browser, "dark")        # the theme's choice is kept for the site (localStorage)
    try:
        problems = [problem for page in pages for problem in dark_problems(browser, site, page)]
    finally:
        set_theme(browser, "light")
    assert not problems, "\n".join(problems)


def test_figure_files_are_opaque_with_a_white_background(site):
    """The PNG itself: an opaque, light corner (a transparent one turns dark in the dark theme)."""
    from PIL import Image

    pngs = sorted((site.html / "_images").glob("*.png"))
    assert pngs, "the site has no figure (is a kernel drawing with MPLBACKEND=Agg?)"
    for png in pngs:
        image = Image.open(png).convert("RGBA")
        for pixel in corners(image):
            assert pixel[3] == 255 and luminance(pixel) > 0.9, f"{png.name}: corner {pixel}"


# ── the checks catch a broken site ────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def broken(site, tmp_path_factory):
    """A copy of the site and of the notebooks, broken six ways on one notebook page."""
    folder = tmp_path_factory.mktemp("broken")
    html, root = folder / "html", folder / "root"
    shutil.copytree(site.html, html)
    shutil.copytree(site.root / "notebooks", root / "notebooks")
    page = next(p for p in site.pages if sitekit.is_notebook_page(p, site.root)
                and sitekit.glue_roles(sitekit.source_of(p, site.root).read_text(encoding="utf-8")))
    stem = Path(page).stem
    text = (html / page).read_text(encoding="utf-8")
    # 1. an image the page shows is gone (a figure where the page has one)
    images = re.findall(r'<img[^>]+src="([^"]+)"', text)
    image = next((src for src in images if "_images/" in src), images[0])
    ((html / page).parent / image).resolve().unlink()
    # 2. a glued number shows another value
    text, changed = re.subn(r'(<span class="pasted-text">)[^<]*(</span>)', r"\g<1>-424242\2",
                            text, count=1)
    assert changed
    # 3. a script error
    text = text.replace("</body>", "<script>notDefinedAnywhere();</script></body>")
    (html / page).write_text(text, encoding="utf-8")
    # 4. a glue key renamed in the source: the build never glued it
    md = root / "notebooks" / f"{stem}.md"
    _, key, _ = sitekit.glue_roles(md.read_text(encoding="utf-8"))[-1]
    source = md.read_text(encoding="utf-8")
    md.write_text(re.sub(r"(\{glue:text\}`)" + re.escape(key) + r"(?=[:`])", rf"\g<1>{key}_renamed",
                         source), encoding="utf-8")
    # 5. the notebook Colab opens is gone; 6. so is the file the download button serves
    (root / "notebooks" / f"{stem}.ipynb").unlink()
    (html / "_sources" / "notebooks" / f"{stem}.ipynb").unlink()
    with Server(html) as server:
        yield page, key, image, Site(html, server.url, root, site.glued)


@pytest.fixture(scope="module")
def broken_visit(browser, broken):
    """The broken page, checked like any other but for axe-core: none of the six breaks is an
    accessibility one, and the same page unbroken is axe-checked by `visits`."""
    page, key, image, copy = broken
    return visit(browser, copy, page, axe=False), page, key, image


def test_a_missing_image_is_caught(broken_visit):
    found, page, key, image = broken_visit
    assert any(Path(image).name in p for p in found["images"]), found["images"]


def test_a_changed_or_renamed_glued_number_is_caught(broken_visit):
    found, page, key, image = broken_visit
    assert any("-424242" in p for p in found["glue"]), found["glue"]
    assert any(f"{key}_renamed" in p and "not glued" in p for p in found["glue"]), found["glue"]


def test_a_console_error_is_caught(broken_visit):
    found, *_ = broken_visit
    assert any("notDefinedAnywhere" in p for p in found["console"]), found["console"]


def test_a_missing_notebook_is_caught(broken_visit):
    found, page, *_ = broken_visit
    stem = Path(page).stem
    assert any("launch link" in p and f"{stem}.ipynb" in p for p in found["launch"]), found["launch"]
    assert any("download link" in p for p in found["download"]), found["download"]


# ── small crafted pages: raw TeX, a request off the site, an accessibility violation ──────

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>{head}</head>
<body><main><h1>{title}</h1>{body}</main></body></html>
"""
#: MathJax as the site loads it: the configuration Sphinx writes, then the site's own copy.
SITE_MATHJAX = ('<script>window.MathJax = {options: {processHtmlClass: "math"}}</script>'
                '<script defer src="_static/mathjax/tex-chtml.js"></script>')
FORMULAS = ('<p>Work per layer <span class="math">\\(n^2 \\cdot d\\)</span>, and '
            'on its own line:</p><div class="math">\\[ \\frac{n}{d} \\]</div>'
            '<p>Also written $$ n \\cdot d^2 $$ in plain text.</p>')
#: A line of 120 characters, put first in a real page's first code cell: it must scroll.
WIDE_LINE = "<span>wide_line = " + "1 + " * 25 + "1</span>\n"
#: Two outputs put first in a real page's first output: printed text of 120 characters, and a
#: table of 30 columns whose headers cannot wrap. Each must be found too wide.
WIDE_OUTPUT = ('<div class="output stream highlight-myst-ansi notranslate"><div class="highlight">'
               "<pre>wide_output = " + "1 + " * 25 + "1</pre></div></div>"
               '<div class="output text_html"><table><tr>'
               + "".join(f"<th>wide_table_column_{i}</th>" for i in range(30)) + "</tr></table></div>")
#: A table of 300 rows alike (so axe_check leaves most out of color-contrast) but row 251, whose
#: second cell is light grey on white: color-contrast must still find that cell.
FAINT = ' style="color:#ccc"'
LONG_TABLE = ("<table class='table'><tbody>"
              + "".join(f"<tr><td>row {i}</td><td{FAINT if i == 251 else ''}>"
                        f"value {i}</td></tr>" for i in range(1, 301))
              + "</tbody></table>")
CRAFTED = {
    # the same formulas, typeset by the site's MathJax: the math check passes (a control)
    "crafted_math.html": dict(title="Typeset", head=SITE_MATHJAX,
                              body=FORMULAS.replace("Also written $$ n \\cdot d^2 $$ in plain "
                                                    "text.", "")),
    # no MathJax: every formula stays TeX
    "crafted_raw_tex.html": dict(title="Raw TeX", head="", body=FORMULAS),
    # an image from another host
    "crafted_offsite.html": dict(title="Off site", head="",
                                 body='<img src="https://example.com/x.png" alt="a picture">'),
    # a faint cell deep in a long table of rows alike
    "crafted_long_table.html": dict(title="Long table", head="", body=LONG_TABLE),
    # docutils' citation markup as sphinxcontrib-bibtex's default :list: citation writes it
    "crafted_citations.html": dict(
        title="Citations", head="",
        body='<div role="list" class="citation-list"><div class="citation" id="id1" '
             'role="doc-biblioentry"><span class="label">[VSP+17]</span><p>Attention is all you '
             'need.</p></div></div>'),
}


#: The crafted pages that axe-core must fault (test_an_accessibility_violation_is_caught and
#: test_low_contrast_in_a_long_table_is_caught).
AXE_CRAFTED = ("crafted_citations.html", "crafted_long_table.html")


@pytest.fixture(scope="module")
def crafted(browser, site, tmp_path_factory):
    """Each crafted page, and a copy of a real page of the book with its MathJax removed,
    visited in a copy of the site: the problems found on each, by aspect. axe-core runs on the
    pages whose axe findings a test reads (AXE_CRAFTED); the three copies of a real page
    are that page, axe-checked by `visits`, plus a change no axe rule is about."""
    html = tmp_path_factory.mktemp("crafted") / "html"
    shutil.copytree(site.html, html)
    for name, parts in CRAFTED.items():
        (html / name).write_text(PAGE.format(**parts), encoding="utf-8")
    page = next(p for p in site.pages if sitekit.is_notebook_page(p, site.root)
                and 'class="math' in (site.html / p).read_text(encoding="utf-8"))
    text, removed = re.subn(r'<script[^>]*src="[^"]*mathjax[^"]*"[^>]*>\s*</script>', "",
                            (site.html / page).read_text(encoding="utf-8"))
    assert removed, f"{page} loads no MathJax script"
    without = str(Path(page).with_name("without_mathjax.html").as_posix())
    (html / without).write_text(text, encoding="utf-8")
    wide_text, widened = re.subn(r'(<div class="cell_input[^"]*">.*?<pre>)', r"\1" + WIDE_LINE,
                                 (site.html / page).read_text(encoding="utf-8"), count=1,
                                 flags=re.S)
    assert widened, f"{page} has no code cell"
    wide = str(Path(page).with_name("wide_cell.html").as_posix())
    (html / wide).write_text(wide_text, encoding="utf-8")
    wide_out_text, widened = re.subn(r'(<div class="cell_output[^"]*">)', r"\1" + WIDE_OUTPUT,
                                     (site.html / page).read_text(encoding="utf-8"), count=1)
    assert widened, f"{page} has no output"
    wide_out = str(Path(page).with_name("wide_output.html").as_posix())
    (html / wide_out).write_text(wide_out_text, encoding="utf-8")
    with Server(html) as server:
        copy = Site(html, server.url, site.root, site.glued)
        yield ({name: visit(browser, copy, name, axe=name in AXE_CRAFTED)
                for name in [*CRAFTED, without, wide, wide_out]}, without, html, wide, wide_out)


def test_typeset_math_passes_the_math_check(crafted):
    found, *_ = crafted
    assert found["crafted_math.html"]["typeset"] == 2, found["crafted_math.html"]
    assert found["crafted_math.html"]["math"] == [], found["crafted_math.html"]["math"]
    assert found["crafted_math.html"]["network"] == [], found["crafted_math.html"]["network"]


def test_raw_tex_is_caught(crafted):
    found, without, *_ = crafted
    math = found["crafted_raw_tex.html"]["math"]
    for delimiter in (r"\(", r"\[", "$$"):
        assert any(f"raw TeX {delimiter} shown" in p for p in math), (delimiter, math)
    assert any(r"\(n^2 \cdot d\)" in p and "not typeset" in p for p in math), math
    assert found["crafted_raw_tex.html"]["typeset"] == 0
    real = found[without]["math"]       # a page of the book, less its MathJax script
    assert any(p.startswith(f"{without}: raw TeX") for p in real), real
    assert any("not typeset" in p for p in real), real


def test_an_offsite_request_is_caught(crafted):
    found, _, html, *_ = crafted
    network = found["crafted_offsite.html"]["network"]
    assert network == ["crafted_offsite.html: requests https://example.com/x.png, which is not "
                       "on the site"], network
    static = sitekit.offsite_resources(html, ["crafted_offsite.html"])
    assert static and "https://example.com/x.png" in static[0], static


def test_a_code_cell_wider_than_the_page_is_caught(crafted):
    found, _, _, wide, _ = crafted
    scroll = found[wide]["scroll"]
    assert any("wide_line = 1 + 1" in problem and wide in problem for problem in scroll), scroll


def test_an_output_wider_than_the_page_is_caught(crafted):
    """Printed text and a table, each named with its page and its cell."""
    found, *_, wide_out = crafted
    outputs = found[wide_out]["outputs"]
    for start in ("'wide_output = 1 + 1", "'wide_table_column_0 wide_table_column_1"):
        assert any(start in problem and wide_out in problem and "the output of cell " in problem
                   for problem in outputs), (start, outputs)


def test_an_accessibility_violation_is_caught(crafted):
    found, *_ = crafted
    axe = found["crafted_citations.html"]["axe"]
    assert any("aria-required-children (critical)" in p and "citation-list" in p
               for p in axe), axe


def test_low_contrast_in_a_long_table_is_caught(crafted):
    """The long table's repeated rows are left out of color-contrast; its one faint row is not."""
    found, *_ = crafted
    axe = found["crafted_long_table.html"]["axe"]
    assert [p for p in axe if "color-contrast (serious)" in p and "value 251" in p], axe
    assert not [p for p in axe if "value 250" in p or "value 252" in p], axe


# ── the pure parts, without a site or a browser ───────────────────────────────────────────


def test_glue_roles_are_read_from_the_prose_only():
    text = ("A {glue:text}`n_pairs:,` and {glue:text}`ratio:.3f`, {glue:text}`other::x.1.y:.0%`\n"
            "and {glue:text}`plain`.\n```{code-cell} ipython3\nprint('{glue:text}`hidden`')\n```\n"
            "```{code-cell} ipython3\n---\nmystnb:\n  figure:\n    caption: At {glue:text}`n:,`\n"
            "---\nplt.title('{glue:text}`also_hidden`')\n```\n"
            "```{code-cell} ipython3\n:tags: [hide-input]\n\nx = '{glue:text}`hidden_too`'\n```\n")
    assert sitekit.glue_roles(text) == [(None, "n_pairs", ","), (None, "ratio", ".3f"),
                                        ("other", "x.1.y", ".0%"), (None, "plain", ""),
                                        (None, "n", ",")]


@pytest.mark.parametrize("value,spec", [
    (746496, ","), (0.13262, ".3f"), (0.08, ".0%"), (3.28e-05, ".2e"), (12288, ""), (True, ""),
    (512, "d"), (7, ".1f"), (0.5, "s"), (2147483648, ",d"),
])
def test_formatting_agrees_with_myst_nb(value, spec):
    """Our formatting of a glued value against myst-nb's own, from the text it stores."""
    from myst_nb.core.variables import format_plain_text

    assert sitekit.format_glued(value, spec) == format_plain_text(repr(value), spec or "s")


def test_glue_problems_name_the_missing_and_the_extra_text():
    problems = sitekit.glue_problems("p.html", ["1", "2", "2"], ["1", "2", "3"])
    assert problems == ["p.html: glued value '3' missing from the page (1×)",
                        "p.html: the page pastes '2' that its source does not glue (1×)"]
    assert sitekit.glue_problems("p.html", ["a", "b"], ["b", "a"]) == []


def test_console_filter_keeps_errors_and_off_site_loads_and_drops_the_favicon():
    base = "http://127.0.0.1:8000"
    entries = [
        {"level": "SEVERE", "message": f"{base}/favicon.ico - Failed to load resource: 404"},
        {"level": "SEVERE", "message": "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex.js - x"},
        {"level": "INFO", "message": f"{base}/a.js 1:1 hello"},
        {"level": "SEVERE", "message": "https://unpkg.com/thing.js - Failed to load resource"},
        {"level": "SEVERE", "message": f"{base}/a.html 3:1 Uncaught ReferenceError: x"},
    ]
    problems = sitekit.console_problems("a.html", entries, base)
    assert len(problems) == 3 and "mathjax" in problems[0] and "unpkg" in problems[1]
    assert "ReferenceError" in problems[2]


def perf(method: str, **params) -> dict:
    """One entry of Chrome's performance log, as chromedriver returns it."""
    return {"level": "INFO", "message": json.dumps({"message": {"method": method,
                                                                "params": params}})}


def test_offsite_requests_are_read_from_the_performance_log():
    base = "http://127.0.0.1:8000"
    entries = [
        perf("Network.requestWillBeSent", documentURL=f"{base}/a.html",
             request={"url": f"{base}/_static/mathjax/tex-chtml.js"}),
        perf("Network.requestWillBeSent", documentURL=f"{base}/a.html",
             request={"url": "data:image/png;base64,AAAA"}),
        perf("Network.requestWillBeSent", documentURL=f"{base}/a.html",
             request={"url": "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"}),
        perf("Network.requestWillBeSent", documentURL=f"{base}/a.html",
             request={"url": "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"}),
        perf("Network.requestWillBeSent", documentURL="chrome://new-tab-page/",
             request={"url": "chrome://resources/x.js"}),        # the browser's own page
        perf("Network.requestWillBeSent", documentURL="chrome://new-tab-page/",
             request={"url": "https://example.org/y.js"}),
        perf("Network.webSocketCreated", url="wss://example.net/socket"),
        perf("Network.responseReceived", response={"url": "https://example.com/z"}),
        perf("Network.requestWillBeSent", documentURL=f"{base}/a.html",
             request={"url": "http://127.0.0.1:9999/other-server.js"}),
    ]
    assert sitekit.offsite_requests("a.html", entries, base) == [
        f"a.html: requests {url}, which is not on the site" for url in (
            "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js",
            "https://example.org/y.js", "wss://example.net/socket",
            "http://127.0.0.1:9999/other-server.js")]


def test_raw_tex_problems_name_the_delimiter_and_the_formula():
    text = r"Work \(n^2 d\) here, and \[ x \] there, and $$y$$; a price of $5 is fine."
    problems = sitekit.raw_tex_problems("p.html", text, [r"\(n^2 d\)"], ["Undefined control"])
    assert [p.split(" shown")[0] for p in problems[:4]] == [
        r"p.html: raw TeX \(", r"p.html: raw TeX \[", "p.html: raw TeX $$", "p.html: raw TeX $$"]
    assert r"Work \(n^2 d\) here" in problems[0]
    assert problems[4] == r"p.html: formula \(n^2 d\) was not typeset by MathJax (no mjx-container)"
    assert problems[5] == "p.html: MathJax could not typeset a formula: Undefined control"
    assert sitekit.raw_tex_problems("p.html", "n² · d, typeset", [], []) == []


def test_axe_problems_are_the_critical_and_serious_ones_with_their_element():
    node = lambda target: {"target": [target], "html": f"<div id='{target}'>"}  # noqa: E731
    results = {"violations": [
        {"id": "aria-required-children", "impact": "critical", "help": "children",
         "nodes": [node(".citation-list")]},
        {"id": "color-contrast", "impact": "serious", "help": "contrast",
         "nodes": [node("#a"), node("#theme-thing")]},
        {"id": "region", "impact": "moderate", "help": "landmarks", "nodes": [node("#b")]},
        {"id": "empty-table-header", "impact": "minor", "help": "header", "nodes": [node("th")]},
    ]}
    assert sitekit.axe_counts(results) == {"critical": 1, "serious": 2, "moderate": 1, "minor": 1}
    problems = sitekit.axe_problems("p.html", results,
                                    excluded={("color-contrast", "#theme-thing"): "the theme's"})
    assert len(problems) == 2
    assert problems[0].startswith("p.html: axe aria-required-children (critical): children, "
                                  "at .citation-list")
    assert problems[1].startswith("p.html: axe color-contrast (serious): contrast, at #a")
