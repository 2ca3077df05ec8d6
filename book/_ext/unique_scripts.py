"""Drop repeated <script> entries from each page.

With Jupyter Book 1.0.4 and Sphinx 7.4, inline scripts that extensions add after the builder
starts (sphinx-thebe's configuration, sphinx-togglebutton's selector) are rendered twice per
page: once from the registry (filename "") and once from the builder (filename None).
sphinx-thebe's declares `const THEBE_JS_URL`, so its second copy throws "SyntaxError:
Identifier 'THEBE_JS_URL' has already been declared" on every page, which the browser test
(tests/test_browser.py) would rightly report. Keeping the first copy of each
identical entry removes the error and changes nothing else.
"""

from __future__ import annotations


def _drop_repeated_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        key = _identity(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def _identity(script) -> tuple:
    # An inline script is stored once with filename None and once with "", hence `or ""`.
    attributes = getattr(script, "attributes", {})
    return (
        getattr(script, "filename", str(script)) or "",
        getattr(script, "priority", 500),
        tuple(sorted((k, str(v)) for k, v in attributes.items())),
    )


def setup(app):
    app.connect("html-page-context", _drop_repeated_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
