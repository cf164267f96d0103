"""Two shortcuts through Sphinx's last step, the one a fresh `make book` waits for.

A fresh build reads each notebook's page as soon as the notebook has run
(scripts/executed_pages.py), but Sphinx writes the pages only once every page is read: by then
the notebooks are done and one core of the book's 2-core machine waits. Two things Sphinx did
in that step are done once, or earlier; the pages are the same.

- **Code is highlighted when its page is read.** Pygments colours some 400 blocks, about 1.5 s.
  `PygmentsBridge.highlight_block` is a function of its arguments (source, language, options,
  line numbers, the builder's output format): its results are kept by those arguments, and a
  block whose arguments differ when the page is written is highlighted then, as before. A block
  that does not lex is warned about when its page is read.
- **A figure's page is loaded once for its cross-references.** To number a `{numref}` reference,
  Sphinx loads the whole page the figure is on (its pickled document tree) and looks the figure
  up, once per reference. The lookup only reads the tree, so one loaded copy per page serves
  every reference to it.
"""

from __future__ import annotations

from docutils import nodes
from sphinx.domains.std import StandardDomain
from sphinx.highlighting import PygmentsBridge

_highlight_block = PygmentsBridge.highlight_block
_resolve_numref = StandardDomain._resolve_numref_xref
_highlighted: dict[tuple, str] = {}
_trees: dict[str, nodes.document] = {}      # while the pages are written: docname -> tree


def highlight_block(self, source, lang, opts=None, force=False, location=None, **kwargs):
    """PygmentsBridge.highlight_block, each distinct call once."""
    key = (self.dest, source, lang, repr(opts), force, repr(sorted(kwargs.items())))
    if key not in _highlighted:
        _highlighted[key] = _highlight_block(self, source, lang, opts, force, location,
                                             **kwargs)
    return _highlighted[key]


def highlight_now(app, doctree: nodes.document) -> None:
    """Highlight a page's code blocks as the HTML writer will (visit_literal_block)."""
    highlighter = getattr(app.builder, "highlighter", None)
    if app.builder.format != "html" or highlighter is None:
        return
    for node in doctree.findall(nodes.literal_block):
        if node.rawsource != node.astext():      # a parsed literal: not highlighted
            continue
        lang = node.get("language", "default")
        linenos = node.get("linenos", False)
        arguments = dict(node.get("highlight_args", {}), force=node.get("force", False))
        if linenos and app.config.html_codeblock_linenos_style:
            linenos = app.config.html_codeblock_linenos_style
        highlighter.highlight_block(node.rawsource, lang,
                                    opts=app.config.highlight_options.get(lang, {}),
                                    linenos=linenos, location=node, **arguments)


def resolve_numref(self, env, fromdocname, builder, typ, target, node, contnode):
    """StandardDomain._resolve_numref_xref, with each page's tree loaded once while the pages
    are written (the lookup only reads it)."""
    load = env.get_doctree

    def loaded_once(docname: str):
        if docname not in _trees:
            _trees[docname] = load(docname)
        return _trees[docname]

    env.get_doctree = loaded_once
    try:
        return _resolve_numref(self, env, fromdocname, builder, typ, target, node, contnode)
    finally:
        del env.get_doctree                  # the method again


def forget_trees(app, env) -> None:
    """Every page is read (the writing starts): no tree loaded before stands."""
    _trees.clear()


def setup(app):
    PygmentsBridge.highlight_block = highlight_block
    StandardDomain._resolve_numref_xref = resolve_numref
    app.connect("doctree-read", highlight_now)
    app.connect("env-updated", forget_trees)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
