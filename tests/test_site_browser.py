"""The book as readers meet it: every page of _build/html opened in a real headless Chromium.

For every page: no console error, every image loaded, every glued number of its source shown,
the Colab/Binder buttons open an .ipynb of the repository, the download button a notebook the
site holds. Then: search finds pages, and figures stay on a light background in the dark theme.
Screenshots go to _build/screenshots/ (light for every page, dark for the notebook pages).

The test serves the site itself on 127.0.0.1 (a free port) and starts Chromium itself (Debian's
chromium + chromium-driver; nothing is downloaded). It SKIPS without _build/html (run `make book`)
or without chromium; with --require-site (.ci/run, after `make book`) both are failures.
The last tests break a copy of the site on purpose and check that the same checks catch it.
"""

from __future__ import annotations

import io
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import book
import sitekit
from sitekit import HTML, ROOT, SCREENSHOTS

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,900", "--hide-scrollbars",
         # Nothing leaves the machine: every host but ours fails at once, without a DNS wait.
         "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]
LOAD_TIMEOUT = 30        # seconds for one page
SEARCH_TIMEOUT = 20      # seconds for the search page to list its results
MAX_SHOT_HEIGHT = 16000  # pixels of a full-page screenshot (Chromium's limit is near 16,384)
LIGHT = 0.6              # least luminance (0 black … 1 white) of a figure's corner in dark mode
ASPECTS = ("console", "images", "glue", "launch", "download")


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
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(LOAD_TIMEOUT)
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
    if not (HTML / "index.html").exists():
        sitekit.skip_or_fail(request.config, "no built site in _build/html: run `make book` first")
    stale = sitekit.stale_pages()
    if stale:
        sitekit.skip_or_fail(request.config, f"the built site is older than notebooks "
                             f"{', '.join(stale)} (or lacks their page): run `make book`")
    try:
        glued = book.glued_values()
    except book.BuildError as error:
        sitekit.skip_or_fail(request.config, f"the build's glued values cannot be read: {error}")
    with sitekit.SiteServer(HTML) as server:
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


def visit(driver, site: Site, page: str) -> dict[str, list[str]]:
    """Open one page and check it; the problems found, by aspect (see ASPECTS)."""
    url = f"{site.url}/{page}"
    driver.get(url)
    wait_loaded(driver)
    found = {aspect: [] for aspect in ASPECTS}
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
    return found


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
                                  {"format": "png", "captureBeyondViewport": True, "clip": clip})
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


def dark_problems(driver, site: Site, page: str) -> list[str]:
    """In the dark theme, each figure of the page keeps a light background around its lines."""
    from PIL import Image

    driver.get(f"{site.url}/{page}")
    wait_loaded(driver)
    set_theme(driver, "dark")
    try:
        problems = []
        theme = driver.execute_script("return document.documentElement.dataset.theme")
        body = driver.execute_script("return getComputedStyle(document.body).backgroundColor")
        rgb = [int(v) for v in re.findall(r"\d+", body)[:3]]
        if theme != "dark" or luminance(rgb) > 0.3:
            problems.append(f"{page}: the dark theme did not apply (theme {theme}, body {body})")
        figures = driver.find_elements("css selector", "img[src*='_images/']")
        for figure in figures:
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
    finally:
        set_theme(driver, "light")


# ── the tests of the site ─────────────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def visits(browser, site):
    """Every page opened once in the light theme, with a full-page screenshot of each."""
    if SCREENSHOTS.exists():
        shutil.rmtree(SCREENSHOTS)
    found = {}
    for page in site.pages:
        found[page] = visit(browser, site, page)
        screenshot(browser, SCREENSHOTS / shot_name(page), full_page=True)
    return found


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


def test_search_finds_pages(browser, site):
    """search.html?q=attention lists results, each a page of the site, a notebook among them."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{site.url}/search.html?q=attention")
    results = "#search-results ul.search li a"
    WebDriverWait(browser, SEARCH_TIMEOUT).until(
        lambda d: d.execute_script("return document.querySelectorAll(arguments[0]).length", results))
    hrefs = attributes(browser, results, "href")
    missing = [h for h in hrefs if not (site.html / h.split("#")[0].split("?")[0]).is_file()]
    assert not missing, f"search results name pages the site lacks: {missing}"
    assert any(h.startswith("notebooks/") for h in hrefs), f"no notebook among {hrefs}"
    assert not sitekit.console_problems("search.html", browser.get_log("browser"), site.url)
    screenshot(browser, SCREENSHOTS / "search.png", full_page=False)


def test_figures_are_readable_in_the_dark_theme(browser, site, visits):
    """Each notebook page in the dark theme; figures keep their light background."""
    problems, seen = [], 0
    for page in site.pages:
        if sitekit.is_notebook_page(page, site.root):
            problems += dark_problems(browser, site, page)
            seen += 1
    assert seen, "no notebook page to look at"
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
    with sitekit.SiteServer(html) as server:
        yield page, key, image, Site(html, server.url, root, site.glued)


@pytest.fixture(scope="module")
def broken_visit(browser, broken):
    """The broken page, checked like any other."""
    page, key, image, copy = broken
    return visit(browser, copy, page), page, key, image


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


def test_console_filter_keeps_errors_and_drops_the_allowed_offsite_loads():
    base = "http://127.0.0.1:8000"
    entries = [
        {"level": "SEVERE", "message": f"{base}/favicon.ico - Failed to load resource: 404"},
        {"level": "SEVERE", "message": "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex.js - x"},
        {"level": "INFO", "message": f"{base}/a.js 1:1 hello"},
        {"level": "SEVERE", "message": "https://unpkg.com/thing.js - Failed to load resource"},
        {"level": "SEVERE", "message": f"{base}/a.html 3:1 Uncaught ReferenceError: x"},
    ]
    problems = sitekit.console_problems("a.html", entries, base)
    assert len(problems) == 2 and "unpkg" in problems[0] and "ReferenceError" in problems[1]
