"""The site where GitHub Pages serves it: below a path (https://OWNER.github.io/REPO/), not at the
root of a host.

The built site is served on 127.0.0.1 under /why-self-attention/ only (anything outside that
path is a 404, as another site of the host would be), and every page is read over HTTP: every
link and file it names (href, src, srcset, a refresh's url, and the url()s and @imports of its
style sheets) must be served, stay below the path, and every #anchor must be an id of its page.
A link written from the host's root (/_static/...) works on `make serve` and breaks on Pages:
this test is where it shows. The PDF too, after `make pdf`.
SKIPS without a fresh _build/html (run `make book`); with --require-site (.ci/run, the workflow)
that is a failure. The last test serves a small broken site and checks that each break is found.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import sitekit

PREFIX = "/why-self-attention/"          # where Pages serves the book: https://OWNER.github.io/REPO/
PDF_NAME = "why-self-attention.pdf"       # beside the pages, after `make pdf`
#: Elements and attributes that name another file of the site: links and the files a page loads.
LINKED = (("a", "href"), ("area", "href"), *sitekit.FETCHED)
CSS_URL = re.compile(r"""url\(\s*(['"]?)(?P<url>[^'")]+)\1\s*\)|@import\s+(['"])(?P<imp>[^'"]+)\3""")
REFRESH = re.compile(r"url\s*=\s*['\"]?(?P<url>[^'\"\s;]+)", re.I)
NOT_FETCHED = ("mailto:", "javascript:", "data:", "blob:", "about:", "tel:")


class BelowPathHandler(http.server.SimpleHTTPRequestHandler):
    """Serve a folder below `prefix` only, as Pages serves a project's site; quietly."""

    prefix = PREFIX

    def send_head(self):
        """A request outside the prefix is another site of the host: 404."""
        if not urlsplit(self.path).path.startswith(self.prefix):
            self.send_error(404, f"outside {self.prefix}")
            return None
        return super().send_head()

    def translate_path(self, path: str) -> str:
        """The file for a path below the prefix (send_head has refused any other)."""
        return super().translate_path("/" + path[len(self.prefix):])

    def log_message(self, *args) -> None:
        """Say nothing."""


@contextlib.contextmanager
def served_below(folder: Path, prefix: str = PREFIX):
    """Serve `folder` on 127.0.0.1 (a free port) under `prefix`; yield the site's URL."""
    handler = functools.partial(type("Handler", (BelowPathHandler,), {"prefix": prefix}),
                                directory=str(folder))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}{prefix}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@functools.cache
def fetch(url: str) -> tuple[int, str, bytes]:
    """(status, content type, body) of a GET, redirects followed (once per URL a run)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.headers.get_content_type(), response.read()
    except urllib.error.HTTPError as error:
        return error.code, "", b""


@functools.cache
def soup_at(url: str):
    """The HTML document served at a URL, parsed (once per URL a run)."""
    from bs4 import BeautifulSoup

    return BeautifulSoup(fetch(url)[2].decode("utf-8", "replace"), "html.parser")


@functools.cache
def ids_at(url: str) -> frozenset[str]:
    """Every id (and old-style name anchor) of the HTML document served at a URL."""
    soup = soup_at(url)
    return frozenset({t["id"] for t in soup.find_all(id=True)} |
                     {t["name"] for t in soup.find_all("a", attrs={"name": True})})


def references(url: str) -> list[tuple[str, str]]:
    """(how the page names it, the URL as written) for every file the HTML page at a URL names."""
    soup = soup_at(url)
    found = []
    for tag, attr in LINKED:
        for element in soup.find_all(tag, attrs={attr: True}):
            found.append((f"<{tag} {attr}", element[attr].strip()))
    for element in soup.find_all(srcset=True):
        found += [(f"<{element.name} srcset", part.split()[0])
                  for part in element["srcset"].split(",") if part.strip()]
    for meta in soup.find_all("meta", attrs={"http-equiv": re.compile("^refresh$", re.I)}):
        url = REFRESH.search(meta.get("content", ""))
        if url:
            found.append(("<meta http-equiv=refresh", url.group("url")))
    return found


def css_references(body: bytes) -> list[tuple[str, str]]:
    """(how the style sheet names it, the URL) for every url() and @import of a style sheet."""
    text = body.decode("utf-8", "replace")
    return [("url()" if m.group("url") else "@import", (m.group("url") or m.group("imp")).strip())
            for m in CSS_URL.finditer(text)]


def subpath_problems(site_url: str, pages: list[str]) -> list[str]:
    """Every page, link, file and anchor of the site, read over HTTP below the site's path, that
    is not there: one sentence each, naming the page (or style sheet) and the link as written."""
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(site_url))
    prefix = urlsplit(site_url).path
    problems, sheets = [], {}

    def check(where: str, how: str, written: str, base: str) -> None:
        if written in ("", "#") or written.lower().startswith(NOT_FETCHED):
            return
        url, _, fragment = urljoin(base, written).partition("#")
        if not url.startswith(origin + "/"):
            return                                             # another host: not this site's
        path = urlsplit(url).path
        if not path.startswith(prefix):
            problems.append(f"{where}: {how}=\"{written}\"> leaves {prefix} (it names {path}, "
                            f"another site of the host on Pages)")
            return
        status, kind, body = fetch(url)
        if status != 200:
            problems.append(f"{where}: {how}=\"{written}\"> is not served below {prefix} "
                            f"({url[len(origin):]}: HTTP {status})")
        elif fragment and kind == "text/html" and unquote(fragment) not in ids_at(url):
            problems.append(f"{where}: {how}=\"{written}\"> names #{unquote(fragment)}, which "
                            f"{path.rsplit('/', 1)[-1] or 'the page'} does not hold")
        elif kind == "text/css":
            sheets[url] = body

    for page in ["", *pages]:                                 # "": the site's own address
        url = site_url + page
        status, kind, body = fetch(url)
        if status != 200 or kind != "text/html":
            problems.append(f"{page or prefix}: not served at {url[len(origin):]} (HTTP {status})")
            continue
        for how, written in references(url):
            check(page or prefix, how, written, url)
    done = set()
    while set(sheets) - done:                                   # style sheets, and those they import
        url = sorted(set(sheets) - done)[0]
        done.add(url)
        for how, written in css_references(sheets[url]):
            if not written.startswith("#"):
                check(url[len(origin):], how, written, url)
    return problems


def clear() -> None:
    """Forget what was fetched: another site, or the same one rebuilt."""
    for cached in (fetch, soup_at, ids_at):
        cached.cache_clear()


# ── the built site ────────────────────────────────────────────────────────────────────────


def test_every_page_link_and_file_is_served_below_the_path(site):
    pages = sitekit.html_pages(site)
    assert len(pages) >= 3, f"too few pages to be the book: {pages}"
    clear()
    with served_below(site) as url:
        problems = subpath_problems(url, pages)
    if not (site / PDF_NAME).exists():   # `make pdf` adds it; the next test asks for it
        problems = [p for p in problems if f'{PDF_NAME}"> is not served' not in p]
    assert not problems, f"{len(problems)} broken below {PREFIX}:\n" + "\n".join(problems)


def test_the_pdf_is_served_beside_the_site(site, request):
    if not (site / PDF_NAME).exists():
        sitekit.skip_or_fail(request.config, f"no {PDF_NAME} in the site: run `make pdf`")
    clear()
    with served_below(site) as url:
        status, _, body = fetch(url + PDF_NAME)
        linked = [written for page in sitekit.html_pages(site)
                  for _, written in references(url + page)
                  if urljoin(url + page, written).split("#")[0] == url + PDF_NAME]
    assert status == 200 and body.startswith(b"%PDF-"), f"{PREFIX}{PDF_NAME}: HTTP {status}"
    assert linked, f"no page links {PDF_NAME}"


def test_every_part_launches_the_repository_that_publishes_it(site):
    """Every part has a Colab, a Binder and a repository button, and each names the repository
    _config.yml names."""
    from bookbuild.common import repository_url

    repository = urlsplit(repository_url()).path.strip("/")
    problems = []
    for stem in sitekit.notebook_stems():
        page = f"notebooks/{stem}.html"
        soup = sitekit.parsed((site / page).resolve())
        hrefs = [a["href"] for a in soup.find_all("a", href=True)]
        named = {"colab": [m.group(1) for h in hrefs if (m := sitekit.COLAB.search(h))],
                 "binder": [m.group(1) for h in hrefs if (m := sitekit.BINDER.search(h))],
                 "repository": [urlsplit(a["href"]).path.strip("/") for a in soup.find_all(
                     "a", href=True, class_="btn-source-repository-button")]}
        for button, names in named.items():
            if not names:
                problems.append(f"{page}: no {button} button")
            problems += [f"{page}: the {button} button names {name}, not {repository}"
                         for name in names if name.strip("/") != repository]
    assert not problems, "\n".join(problems)


# ── the check finds each kind of break ────────────────────────────────────────────────────


def write(path: Path, text: str) -> None:
    """Write a file, making its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_the_check_finds_every_kind_of_break_below_the_path(tmp_path):
    write(tmp_path / "index.html", '<meta http-equiv="Refresh" content="0; url=book/intro.html" />')
    write(tmp_path / "book" / "intro.html",
          '<link rel="stylesheet" href="../_static/a.css?v=1"><p id="top">Intro</p>'
          '<a href="#top">self</a> <a href="other.html#here">ok</a> <a href="other.html#gone">'
          'no anchor</a> <a href="/book/other.html">from the host\'s root</a>'
          '<img src="../_images/gone.png" alt=""> <img src="../_images/a.png" '
          'srcset="../_images/a.png 1x, ../_images/b.png 2x" alt="">'
          '<a href="https://example.org/">another host</a> <a href="mailto:a@b.c">mail</a>'
          '<a href="../why-self-attention.pdf">PDF</a> <a href="../">home</a>')
    write(tmp_path / "book" / "other.html", '<p id="here">Other</p>')
    write(tmp_path / "_static" / "a.css", '@import "b.css"; .x { background: url(data:image/png;'
          'base64,AA) } @font-face { src: url("../fonts/ok.woff2") }')
    write(tmp_path / "_static" / "b.css", ".y { background: url('/_static/c.png') } "
          ".z { background: url(../fonts/gone.woff2) } .w { fill: url(#grad) }")
    write(tmp_path / "fonts" / "ok.woff2", "font")
    write(tmp_path / "_images" / "a.png", "png")
    write(tmp_path / "why-self-attention.pdf", "%PDF-1.7")
    clear()
    with served_below(tmp_path) as url:
        problems = subpath_problems(url, ["book/intro.html", "book/other.html"])
        outside = fetch(url.replace(PREFIX, "/") + "book/intro.html")[0]
    assert outside == 404                                  # the host's root is another site
    found = sorted(re.search(r'="([^"]+)">', p).group(1) for p in problems)
    assert found == ["../_images/b.png", "../_images/gone.png", "../fonts/gone.woff2",
                     "/_static/c.png", "/book/other.html", "other.html#gone"], problems
    assert any(p.startswith("book/intro.html: <a href=\"/book/other.html\"> leaves /why-self-attention/")
               for p in problems)
    assert any(p.startswith("/why-self-attention/_static/b.css: url()=\"/_static/c.png\"> leaves")
               for p in problems)
