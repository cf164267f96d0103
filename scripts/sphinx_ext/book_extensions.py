"""The book's Sphinx extension: three fixes of other libraries' HTML,
each through Sphinx's public API, each until its library fixes it.

1. The bibliography as a list assistive technology can read: docutils
   0.21 writes sphinxcontrib-bibtex's entries as role="doc-biblioentry"
   inside role="list", a role DPUB-ARIA 1.1 deprecates
   (https://github.com/w3c/dpub-aria/pull/22; axe-core: critical
   aria-required-children). Written here with role="listitem", through
   Sphinx's public `add_node(override=True)`. No docutils or
   sphinxcontrib-bibtex issue was found for it. (sphinxcontrib-bibtex's
   own `:list: bullet` writes a plain list, but then its `{cite}` roles
   find no entry: "could not find bibtex key".)
2. Each script of a page once: sphinx-thebe 0.3.1 and sphinx-togglebutton
   0.4.5 add their inline scripts after the HTML builder started, Sphinx
   7.4 lists them twice, and a second `const THEBE_JS_URL` is a
   SyntaxError. No upstream issue was found for it.
3. myst-nb's hidden-cell node in `singlehtml` (`make pdf`): once
   sphinx-exercise registers its nodes for "singlehtml", Sphinx looks
   every node up under that name only, and myst-nb registered its node for
   "html" alone (https://github.com/sphinx-doc/sphinx/issues/9160). Here
   myst-nb's own visitors are registered for "singlehtml" too.
"""

from docutils import nodes


def visit_citation(self, node) -> None:
    """Open the list before the first of adjacent entries, then the entry
    as a list item."""
    if not isinstance(node.previous_sibling(), type(node)):
        self.body.append('<div role="list" class="citation-list">\n')
    self.body.append(self.starttag(node, "div", classes=[node.tagname],
                                   role="listitem"))


def depart_citation(self, node) -> None:
    """Close the entry, and the list after the last of adjacent entries."""
    self.body.append("</div>\n")
    if not isinstance(node.next_node(descend=False, siblings=True),
                      type(node)):
        self.body.append("</div>\n")


def unique_scripts(app, pagename, templatename, context, doctree) -> None:
    """Keep the first of each script (same file or body, same attributes).
    """
    seen, kept = set(), []
    for script in context.get("script_files", []):
        # Sphinx 7.4's _JavaScript: its file (the repeat has '' where the
        # first has None) and its attributes, the inline body among them;
        # read directly, so that a change in Sphinx fails here by name
        key = (script.filename or "",
               tuple(sorted((k, str(v))
                            for k, v in script.attributes.items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def setup(app):
    """Register the three fixes."""
    # myst-nb 1.4.0's documented API lacks this node; only sphinx_ has it
    from myst_nb.sphinx_ import (
        HideCodeCellNode,
        depart_HideCellInput,
        visit_HideCellInput,
    )

    app.setup_extension("myst_nb")     # its node first, then ours over it
    citation = (visit_citation, depart_citation)
    app.add_node(nodes.citation, override=True, html=citation,
                 singlehtml=citation)
    hidden = (visit_HideCellInput, depart_HideCellInput)
    app.add_node(HideCodeCellNode, override=True, html=hidden,
                 singlehtml=hidden)
    # last among the page-context handlers, once the themes added theirs
    app.connect("html-page-context", unique_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
