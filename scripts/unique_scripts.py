"""A Sphinx extension of the book: write each script of a page once.

sphinx-thebe 0.3.1 and sphinx-togglebutton 0.4.5 add their inline configuration scripts after
the HTML builder has started; Sphinx 7.4 then lists them twice in every page. A second
`const THEBE_JS_URL = ...` is a SyntaxError in the reader's console on every page. This
extension drops the repeats from the page's list of scripts before the page is written.
"""


def unique_scripts(app, pagename, templatename, context, doctree) -> None:
    """Keep the first of each script (same file, same inline body, same attributes)."""
    seen, kept = set(), []
    for script in context.get("script_files", []):
        # Sphinx wrote the repeat with filename '' where the first has None: compare as text.
        attributes = getattr(script, "attributes", {})
        key = (getattr(script, "filename", script) or "",
               tuple(sorted((name, str(value)) for name, value in attributes.items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def setup(app):
    """Run last among the page-context handlers, once the themes have added theirs."""
    app.connect("html-page-context", unique_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
