"""`make pdf`: the book as one PDF. Jupyter Book's `singlehtml` build of
the cache is written as print.html with pdf_assets/ (print.css: dropdowns
open, the title and page numbers in the margins; dress.js: a title page
and contents from _toc.yml), printed by `chromium --headless
--print-to-pdf` (bookmarks from the headings) into _build/pdf/ and the
site. tests/site/test_pdf.py checks what it holds."""

import json
import shutil
import subprocess
import time
from pathlib import Path

import yaml

from bookbuild.common import BUILD, ROOT, book_config, fail, rel
from bookbuild.execute import require_executed
from bookbuild.site import render as render_site

ASSETS = Path(__file__).with_name("pdf_assets")
SINGLE = BUILD / "singlehtml"
PDF_NAME = "why-self-attention.pdf"
PDF = BUILD / "pdf" / PDF_NAME
SITE_COPY = BUILD / "html" / PDF_NAME   # the intro links it
ROOT_PAGE = "book/intro.html"     # Sphinx writes the single page here,
ENTRY = "print.html"              # ... its links relative to the top
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: Headless Chromium here and in the browser test: every host but ours
#: fails at once, without a DNS wait. Add a --window-size.
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-quic", "--no-first-run",
                 "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars",
                 "--host-resolver-rules=MAP * ~NOTFOUND , "
                 "EXCLUDE 127.0.0.1"]
#: seconds of the page's own time (scripts, MathJax) before it prints
LOAD_TIMEOUT = 120


def contents_entries() -> list[tuple[str, str | None, str | None]]:
    """_toc.yml as (kind, title, docname): the root page (the intro),
    then each part's caption and chapters."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    entries = [("chapter", None, None)]
    for part in toc.get("parts", [{"chapters": toc.get("chapters", [])}]):
        if part.get("caption"):
            entries.append(("part", part["caption"], None))
        entries += [("chapter", None, c["file"])
                    for c in part.get("chapters", [])]
    return entries


def render() -> None:
    """The singlehtml build, then print.html: the page with its print
    styles and dress.js, its links to itself kept in the page."""
    render_site("singlehtml", fresh=True)
    config = book_config()
    meta = {"title": config["title"], "author": config.get("author", ""),
            "subtitle": "Table 1 of Attention Is All You Need, counted, "
                        "measured and checked",
            "built": f"Built {time.strftime('%Y-%m-%d', time.gmtime())} "
                     "from the executed notebooks; every number is "
                     "computed"}
    dress = (f"<style>{(ASSETS / 'print.css').read_text(encoding='utf-8')}"
             f"@page {{ @top-right {{ content: "
             f"{json.dumps(config['title'])}; }} }}</style>\n"
             f"<script>const TOC = {json.dumps(contents_entries())}, "
             f"META = {json.dumps(meta)};\n"
             f"{(ASSETS / 'dress.js').read_text(encoding='utf-8')}"
             f"</script>\n</body>")
    text = (SINGLE / ROOT_PAGE).read_text(encoding="utf-8")
    text = text.replace(f'href="{ROOT_PAGE}#', 'href="#')
    (SINGLE / ENTRY).write_text(text.replace("</body>", dress, 1),
                                encoding="utf-8")
    print(f"single page: {rel(SINGLE / ENTRY)} (from the executed cache)")


def make_pdf() -> None:
    """Everything `make pdf` does; a stale cache stops it first."""
    start = time.perf_counter()
    require_executed()
    if not (BUILD / "html" / "index.html").exists():
        fail("no built site in _build/html: run `make book` first")
    if not Path(CHROMIUM).exists():
        fail(f"no {CHROMIUM}: install Debian's chromium (`make chromium`)")
    render()
    PDF.parent.mkdir(parents=True, exist_ok=True)
    PDF.unlink(missing_ok=True)
    done = subprocess.run(
        [CHROMIUM, *BROWSER_FLAGS, "--allow-file-access-from-files",
         "--no-pdf-header-footer", "--generate-pdf-document-outline",
         f"--virtual-time-budget={LOAD_TIMEOUT * 1000}",
         f"--print-to-pdf={PDF}", (SINGLE / ENTRY).as_uri()],
        capture_output=True, text=True, timeout=LOAD_TIMEOUT + 60)
    if done.returncode != 0 or not PDF.exists():
        fail(f"chromium printed no PDF (exit {done.returncode}): "
             f"{done.stderr.strip().splitlines()[-1:]}")
    shutil.copyfile(PDF, SITE_COPY)
    print(f"pdf: {rel(PDF)}: {PDF.stat().st_size / 2**20:.1f} MiB; copied "
          f"to {rel(SITE_COPY)}; {time.perf_counter() - start:.1f} s")
