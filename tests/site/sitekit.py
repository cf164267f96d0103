"""What the site tests share: the built site, its pages, the glue each page must show, a server.

The pages are discovered, never listed: every .html under _build/html, and every notebooks/*.md.
The functions return lists of problems (plain sentences naming the page) so that the tests can
report all of them at once, and so that the tests of the tests can feed them a broken copy.
"""

from __future__ import annotations

import functools
import http.server
import re
import threading
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
NOT_PAGES = {"_static", "_sources", "_images"}       # folders of the site that hold no book page
REQUIRE_SITE = "--require-site"                       # the pytest option .ci/run passes

def exercises(md: Path) -> list[tuple[str, str]]:
    """(label, title) of every exercise of a notebook, in page order."""
    from bookbuild.ledger import EXERCISE

    return [(m["label"], m["title"]) for m in EXERCISE.finditer(md.read_text(encoding="utf-8"))]


# ── what must be there ────────────────────────────────────────────────────────────────────


def site_required(config) -> bool:
    """Is a missing site or browser a failure (CI, after `make book`) rather than a skip?"""
    return bool(config.getoption(REQUIRE_SITE))


def skip_or_fail(config, reason: str) -> None:
    """Skip with the reason, or fail with it where the site is required."""
    if site_required(config):
        pytest.fail(f"{reason} ({REQUIRE_SITE} was given, so this is a failure)")
    pytest.skip(reason)


def fresh_site_or_skip(config, html_dir: Path = HTML) -> Path:
    """The built site, if there is one and it is newer than every notebook; else skip (or fail)."""
    if not (html_dir / "index.html").exists():
        skip_or_fail(config, "no built site in _build/html: run `make book` first")
    stale = stale_pages(html_dir)
    if stale:
        skip_or_fail(config, f"the built site is older than notebooks {', '.join(stale)} "
                     f"(or lacks their page): run `make book`")
    mark = html_dir / ".cache-state"          # the executed copies it was rendered from
    from bookbuild.site import cache_state

    if html_dir == HTML and (not mark.exists() or mark.read_text(encoding="utf-8") != cache_state()):
        skip_or_fail(config, "the notebooks ran again since the site was rendered: run `make book`")
    return html_dir


def html_pages(html_dir: Path = HTML) -> list[str]:
    """Every page of the built site, as a path relative to the site (posix), sorted."""
    return sorted(p.relative_to(html_dir).as_posix() for p in html_dir.rglob("*.html")
                  if not NOT_PAGES & set(p.relative_to(html_dir).parts))


def notebook_stems(root: Path = ROOT) -> list[str]:
    """The notebooks of the book: notebooks/NN_name.md."""
    return sorted(p.stem for p in (root / "notebooks").glob("[0-9][0-9]_*.md"))


def source_of(page: str, root: Path = ROOT) -> Path | None:
    """The MyST source of a page (notebooks/01_costs.html → notebooks/01_costs.md), if any."""
    md = root / Path(page).with_suffix(".md")
    return md if md.exists() else None


def is_notebook_page(page: str, root: Path = ROOT) -> bool:
    """A page rendered from notebooks/NN_name.md."""
    return page.startswith("notebooks/") and source_of(page, root) is not None


def stale_pages(html_dir: Path = HTML, root: Path = ROOT) -> list[str]:
    """Notebooks whose page is missing from the site or older than their .md."""
    stale = []
    for stem in notebook_stems(root):
        page, md = html_dir / "notebooks" / f"{stem}.html", root / "notebooks" / f"{stem}.md"
        if not page.exists() or page.stat().st_mtime < md.stat().st_mtime:
            stale.append(stem)
    return stale


# ── glue ──────────────────────────────────────────────────────────────────────────────────

GLUE_TEXT = re.compile(r"\{glue:text\}`([^`]+)`")
CODE_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(?P<body>.*?)^```\s*$", re.S | re.M)
CELL_OPTIONS = re.compile(r"\A---\n.*?\n---\n|\A(?::[^\n]*\n)+", re.S)


def without_code(md_text: str) -> str:
    """A MyST notebook without its code: each code cell keeps only its options (a caption)."""
    def options(cell: re.Match) -> str:
        found = CELL_OPTIONS.match(cell.group("body"))
        return found.group(0) if found else ""
    return CODE_CELL.sub(options, md_text)


def glue_roles(md_text: str) -> list[tuple[str | None, str, str]]:
    """Every {glue:text} role of a page's prose and captions: (other page or None, key, spec)."""
    prose = without_code(md_text)
    roles = []
    for content in GLUE_TEXT.findall(prose):
        doc, _, rest = content.rpartition("::") if "::" in content else (None, "", content)
        key, _, spec = rest.partition(":")           # keys never hold a colon; the spec may
        roles.append((Path(doc).name.removesuffix(".md") if doc else None, key, spec))
    return roles


def format_glued(value, spec: str) -> str:
    """A glued value as {glue:text}`key:spec` pastes it (the type letter converts it first)."""
    if spec in ("", "s"):
        return str(value)
    letter = spec[-1]
    if letter in "bcdoxX":
        value = int(value)
    elif letter in "eEfFgGn%":
        value = float(value)
    return format(value, spec)


def expected_pasted(md: Path, page: str, glued: dict) -> tuple[list[str], list[str]]:
    """The texts a page must paste, in order, and the problems met (a key that is not glued)."""
    texts, problems = [], []
    for doc, key, spec in glue_roles(md.read_text(encoding="utf-8")):
        where = doc or Path(page).stem
        if key not in glued.get(where, {}):
            problems.append(f"{page}: glue key {where}::{key} is used in {md.name} but not glued "
                            f"by the build")
            continue
        texts.append(format_glued(glued[where][key].value, spec))
    return texts, problems


def glue_problems(page: str, pasted: list[str], expected: list[str]) -> list[str]:
    """Compare the texts a page shows in <span class="pasted-text"> with those it must show."""
    problems = []
    # Sphinx's smart quotes set a glued phrase's ' and " as ’ and ”: the same words
    straight = str.maketrans({"‘": "'", "’": "'", "“": '"', "”": '"'})
    pasted = [text.translate(straight) for text in pasted]
    expected = [text.translate(straight) for text in expected]
    missing, extra = Counter(expected) - Counter(pasted), Counter(pasted) - Counter(expected)
    for text, count in missing.items():
        problems.append(f"{page}: glued value {text!r} missing from the page ({count}×)")
    for text, count in extra.items():
        problems.append(f"{page}: the page pastes {text!r} that its source does not glue ({count}×)")
    return problems


def figure_cells(md: Path) -> int:
    """How many code cells of a notebook declare a figure (mystnb: figure: in their metadata)."""
    import jupytext

    notebook = jupytext.read(md, fmt="md:myst")
    return sum(1 for cell in notebook.cells
               if cell.cell_type == "code" and cell.metadata.get("mystnb", {}).get("figure"))


# ── launch and download buttons ───────────────────────────────────────────────────────────

COLAB = re.compile(r"colab\.research\.google\.com/github/([^/]+/[^/]+)/blob/([^/]+)/(.+)$")
BINDER = re.compile(r"mybinder\.org/v2/gh/([^/]+/[^/]+)/([^?]+)\?urlpath=lab/tree/(.+)$")


def repository() -> tuple[str, str]:
    """The repository (owner/name) and branch that _config.yml names."""
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]
    return urlsplit(config["url"]).path.strip("/"), config.get("branch", "main")


def launch_problems(page: str, hrefs: list[str], root: Path = ROOT) -> list[str]:
    """Every Colab/Binder link opens an .ipynb of this repository that exists in the checkout."""
    problems, repo = [], repository()
    found = 0
    for href in hrefs:
        for pattern in (COLAB, BINDER):
            match = pattern.search(href)
            if not match:
                continue
            found += 1
            (name, branch, path) = match.groups()
            if (name, branch) != repo:
                problems.append(f"{page}: launch link {href} names {name}@{branch}, "
                                f"_config.yml names {repo[0]}@{repo[1]}")
            if not path.endswith(".ipynb") or not (root / unquote(path)).is_file():
                problems.append(f"{page}: launch link {href} opens {path}, which is not an .ipynb "
                                f"of the repository")
    if is_notebook_page(page, root) and not any(COLAB.search(h) for h in hrefs):
        problems.append(f"{page}: a notebook page without a Colab button")
    return problems


def download_problems(page: str, page_url: str, hrefs: list[str], html_dir: Path,
                      base_url: str) -> list[str]:
    """The download button of a notebook page links an .ipynb that the site holds."""
    import nbformat

    urls = [urljoin(page_url, h) for h in hrefs if urlsplit(h).path.endswith(".ipynb")]
    local = [u for u in urls if u.startswith(base_url + "/")]
    if not local:
        return [f"{page}: no download link to an .ipynb"]
    problems = []
    for url in local:
        target = html_dir / unquote(urlsplit(url).path.lstrip("/"))
        if not target.is_file():
            problems.append(f"{page}: the download link {url} names a file the site lacks")
            continue
        try:
            nbformat.reads(target.read_text(encoding="utf-8"), as_version=4)
        except Exception as error:      # noqa: BLE001 — any failure to read is the finding
            problems.append(f"{page}: the downloaded {target.name} is not a notebook ({error})")
    return problems


# ── the browser's console ─────────────────────────────────────────────────────────────────


def console_problems(page: str, entries: list[dict], base_url: str) -> list[str]:
    """The SEVERE entries of the browser's log, less the browser's own guess at /favicon.ico
    (the book names no icon; its server root is not ours). A failed off-site load is a finding:
    the site serves everything itself, MathJax included."""
    problems = []
    for entry in entries:
        if entry.get("level") != "SEVERE":
            continue
        message = entry.get("message", "")
        url = message.split(" ", 1)[0]
        if url == f"{base_url}/favicon.ico":
            continue
        problems.append(f"{page}: console error: {message}")
    return problems


# ── a self-contained site: math typeset, nothing requested off the site ───────────────────

#: Raw TeX a reader must never see: MathJax's inline and display delimiters, and $$.
RAW_TEX = re.compile(r"\\\(|\\\[|\$\$")
#: Schemes of URLs that never leave the page: nothing is fetched for them.
NO_FETCH = ("data:", "blob:", "about:")


def raw_tex_problems(page: str, text: str, untypeset: list[str], errors: list[str]) -> list[str]:
    """Formulas left as TeX: delimiters in the page's visible prose (code removed), math elements
    without MathJax's output (mjx-container), and formulas MathJax could not typeset (merror)."""
    problems = []
    for found in RAW_TEX.finditer(text):
        around = " ".join(text[max(0, found.start() - 30):found.end() + 50].split())
        problems.append(f"{page}: raw TeX {found.group(0)} shown as text: ...{around}...")
    for tex in untypeset:
        problems.append(f"{page}: formula {' '.join(tex.split())[:80]} was not typeset by "
                        f"MathJax (no mjx-container)")
    for error in errors:
        problems.append(f"{page}: MathJax could not typeset a formula: {error[:80]}")
    return problems


def is_local(url: str, base_url: str) -> bool:
    """Is a URL this site's own (or one that fetches nothing)?"""
    return url == base_url or url.startswith(base_url + "/") or url.startswith(NO_FETCH)


def offsite_requests(page: str, entries: list[dict], base_url: str) -> list[str]:
    """Every request the browser made for a page that is not to the site itself, read from
    Chrome's performance log (the DevTools Network events that chromedriver records). A request
    counts when the page's document made it, or when it is http(s)/ws(s) from anywhere."""
    import json

    problems = []
    for entry in entries:
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message.get("method") == "Network.requestWillBeSent":
            url, document = params.get("request", {}).get("url", ""), params.get("documentURL", "")
        elif message.get("method") == "Network.webSocketCreated":
            url, document = params.get("url", ""), ""
        else:
            continue
        ours = is_local(document, base_url) and not document.startswith(NO_FETCH)
        web = urlsplit(url).scheme in ("http", "https", "ws", "wss", "ftp")
        if not is_local(url, base_url) and (ours or web):
            problem = f"{page}: requests {url}, which is not on the site"
            if problem not in problems:
                problems.append(problem)
    return problems


#: Elements whose attribute makes the browser fetch a file.
FETCHED = (("script", "src"), ("link", "href"), ("img", "src"), ("iframe", "src"),
           ("source", "src"), ("video", "src"), ("audio", "src"), ("embed", "src"),
           ("object", "data"), ("video", "poster"))


def offsite_resources(html_dir: Path, pages: list[str] | None = None) -> list[str]:
    """Every <script src>, <link href>, <img src> (and srcset) and the like, in every page's
    HTML, names a file of the site itself: no CDN, no other host, no protocol-relative //."""
    problems = []
    for page in pages if pages is not None else html_pages(html_dir):
        soup = parsed((html_dir / page).resolve())
        for tag, attr in FETCHED:
            for element in soup.find_all(tag, attrs={attr: True}):
                urls = [(attr, element[attr].strip())]
                urls += [("srcset", part.split()[0])
                         for part in element.get("srcset", "").split(",") if part.strip()]
                for name, url in urls:
                    parts = urlsplit(url)
                    if (parts.scheme or parts.netloc) and not url.startswith(NO_FETCH):
                        problems.append(f"{page}: <{tag} {name}=\"{url}\"> loads a file from "
                                        f"outside the site")
    return problems


# ── accessibility (axe-core) ──────────────────────────────────────────────────────────────

#: The impacts that fail the build. Moderate and minor ones are counted and reported only
#: (today: the theme's sidebar outside a landmark, `region`, moderate; pandas tables' empty
#: index header, `empty-table-header`, minor).
AXE_FAILING = ("critical", "serious")
#: Violations of the theme (sphinx-book-theme), not of the book's content, that do not fail the
#: build: (rule, CSS selector of the element) -> why. Empty today: axe-core 4.9.1 finds no
#: critical or serious violation in the theme.
AXE_THEME_EXCLUDED: dict[tuple[str, str], str] = {}
IMPACTS = ("critical", "serious", "moderate", "minor")


def axe_counts(results: dict) -> dict[str, int]:
    """Elements with a violation, by impact (an element counted once per rule it breaks)."""
    counts = dict.fromkeys(IMPACTS, 0)
    for violation in results.get("violations", []):
        counts[violation.get("impact") or "minor"] += len(violation["nodes"])
    return counts


def axe_problems(page: str, results: dict,
                 excluded: dict[tuple[str, str], str] = AXE_THEME_EXCLUDED) -> list[str]:
    """Each critical or serious violation axe found on a page: rule, impact, element, help."""
    problems = []
    for violation in results.get("violations", []):
        if violation.get("impact") not in AXE_FAILING:
            continue
        for node in violation["nodes"]:
            target = " ".join(str(t) for t in node.get("target", []))
            if (violation["id"], target) in excluded:
                continue
            problems.append(f"{page}: axe {violation['id']} ({violation['impact']}): "
                            f"{violation['help']}, at {target}: {node.get('html', '')[:160]}")
    return problems


# ── links of the static site ──────────────────────────────────────────────────────────────


@functools.cache
def parsed(path: Path):
    """A page parsed with BeautifulSoup (cached: pages are read once per run)."""
    from bs4 import BeautifulSoup

    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


@functools.cache
def ids_of(path: Path) -> frozenset[str]:
    """Every id (and old-style name anchor) of a page."""
    soup = parsed(path)
    return frozenset({tag["id"] for tag in soup.find_all(id=True)} |
                     {tag["name"] for tag in soup.find_all("a", attrs={"name": True})})


def internal_target(html_dir: Path, page: str, url: str) -> tuple[Path, str] | None:
    """(file, fragment) that a link of the site points at, or None for an outside or no-op link."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or url.startswith(("mailto:", "javascript:", "data:")):
        return None
    if not parts.path:                                        # "#anchor": the page itself
        return html_dir / page, unquote(parts.fragment)
    target = (html_dir / page).parent / unquote(parts.path)
    if target.is_dir():
        target = target / "index.html"
    return target.resolve(), unquote(parts.fragment)


def link_problems(html_dir: Path, pages: list[str] | None = None) -> list[str]:
    """Every internal href, src and anchor of the site resolves to a file and an id there."""
    problems = []
    for page in pages if pages is not None else html_pages(html_dir):
        soup = parsed((html_dir / page).resolve())
        for tag, attr in (("a", "href"), ("link", "href"), ("img", "src"), ("script", "src")):
            for element in soup.find_all(tag, attrs={attr: True}):
                url = element[attr].strip()
                if url in ("", "#"):
                    continue
                found = internal_target(html_dir, page, url)
                if found is None:
                    continue
                target, fragment = found
                if not target.is_file():
                    problems.append(f"{page}: <{tag} {attr}=\"{url}\"> names a missing file")
                elif fragment and target.suffix == ".html" and fragment not in ids_of(target):
                    problems.append(f"{page}: <{tag} {attr}=\"{url}\"> names #{fragment}, "
                                    f"which {target.name} does not hold")
    return problems


# ── verdicts in running text ──────────────────────────────────────────────────────────────

VERDICT = re.compile(r"\b(True|False)\b")


def verdicts_in_text(html_dir: Path = HTML) -> list[str]:
    """Every True or False that a notebook page shows in running text: paragraphs and list
    items outside code cells and tables. A check belongs in a hidden cell and the ledger; the
    reader sees a sentence, not a test log."""
    problems = []
    for page in html_pages(html_dir):
        if not page.startswith("notebooks/"):
            continue
        main = parsed((html_dir / page).resolve()).find("main") or parsed((html_dir / page).resolve())
        for block in main.select("p, li"):
            if block.find_parent(class_="cell") or block.find_parent("table"):
                continue
            if block.find_parent("li") and block.name == "p":
                continue                     # its list item is read whole
            # inline code (`is_causal=True`) is code, not a verdict
            text = " ".join(" ".join(
                piece for piece in block.find_all(string=True)
                if not piece.find_parent(["code", "kbd", "samp"])).split())
            for found in VERDICT.finditer(text):
                start = max(0, found.start() - 60)
                problems.append(f"{page}: …{text[start:found.end() + 20]}…")
    return problems


# ── outputs cut short ─────────────────────────────────────────────────────────────────────

#: pandas' marks of a table it printed in part: "[5 rows x 12 columns]" under a text table,
#: "5 rows × 12 columns" under an HTML one, and "..." (or "…") standing for the rows or columns
#: it left out: a cell of its own in HTML; in text, a column of its own, set off by two spaces
#: (or a line's end) on each side, as pandas aligns its columns.
SHAPE_LINE = re.compile(r"\[?\d+ rows [x×] \d+ columns\]?")
ELLIPSIS = re.compile(r"(?:^|\s\s)(?:\.\.\.|…)(?:\s\s|$)")


def truncated_outputs(html_dir: Path = HTML, pages: list[str] | None = None) -> list[str]:
    """Every output of a notebook page that pandas cut short: names the page, the cell (its
    number among the cells the page shows, and its first line of code) and the mark found."""
    problems = []
    for page in pages if pages is not None else html_pages(html_dir):
        if not page.startswith("notebooks/"):
            continue
        soup = parsed((html_dir / page).resolve())
        for number, cell in enumerate(soup.select("div.cell"), start=1):
            code = cell.select_one("div.cell_input pre")
            first = code.get_text().split("\n")[0].strip()[:50] if code else ""
            where = f"{page}: the output of cell {number}" + (f" ({first!r})" if first else "")
            for output in cell.select("div.cell_output"):
                cut = [c for c in output.select("td, th") if c.get_text(strip=True) in ("...", "…")]
                marks = [f"a cell {cut[0].get_text(strip=True)!r}"] if cut else []
                for pre in output.select("pre"):     # the first line with a gap, if any
                    lines = [line for line in pre.get_text().split("\n") if ELLIPSIS.search(line)]
                    marks += [f"{ELLIPSIS.search(lines[0]).group().strip()!r} in "
                              f"{lines[0].strip()[:50]!r}"] if lines else []
                marks += [repr(m.group()) for m in SHAPE_LINE.finditer(output.get_text(" "))]
                problems += [f"{where} is cut short by pandas: {mark}" for mark in marks]
    return problems


# ── a server for the browser tests ───────────────────────────────────────────────────────


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serve files without a log line per request."""

    def log_message(self, *args) -> None:
        """Say nothing."""


class Server:
    """Serve a folder on 127.0.0.1 at a free port, in a thread, until
    stopped."""

    def __init__(self, folder: Path):
        handler = functools.partial(QuietHandler, directory=str(folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
