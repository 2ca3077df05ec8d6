"""Serve the book's third-party JavaScript from the book itself, so pages work offline.

Two kinds of page need JavaScript that Sphinx and myst-nb load from public CDNs by default, which
fails on a machine with no network:

- Pages with saved ipywidgets state need require.js and the widget manager
  `@jupyter-widgets/html-manager` (its `embed-amd.js` bundles the base, controls and output
  widgets). myst-nb's setting `nb_ipywidgets_js` names them, and myst-nb adds them to those pages.
- Pages with math need MathJax 3. Sphinx's setting `mathjax_path` names it, and Sphinx adds it to
  those pages. `tex-svg-full.js` holds every TeX extension and draws SVG, so it fetches no
  further files (no fonts, no extensions loaded on demand).

Copies from the npm registry sit in `book/_vendor/` (versions and licenses in its README).

Why not `_static/`: Jupyter Book adds every .js file under a `_static/` folder to EVERY page, and
these are megabytes. Here the folder is added to `html_static_path` from inside Sphinx (after
Jupyter Book's scan), so only the pages that need a script get it.
"""

from __future__ import annotations

from pathlib import Path

VENDOR_DIR = Path(__file__).resolve().parent.parent / "_vendor"
WIDGETS_SUBDIR = "jupyter-widgets"  # copied to _build/html/_static/jupyter-widgets/
REQUIRE_JS = f"{WIDGETS_SUBDIR}/require.js"
EMBED_JS = f"{WIDGETS_SUBDIR}/embed-amd.js"
MATHJAX_JS = "mathjax/tex-svg-full.js"  # copied to _build/html/_static/mathjax/

# The bundle's modules find their icon fonts relative to their own require.js module URL, which
# by default is a made-up path under the page's folder. Point those module names at the vendored
# folder. An inline script cannot know its own URL, so it takes the folder from the require.js tag
# just above it.
_MODULE_PATHS_SCRIPT = (
    "(function () {"
    f" var tag = document.querySelector('script[src*=\"{REQUIRE_JS}\"]');"
    " if (!tag || !window.require) { return; }"
    " var dir = tag.src.replace(/\\/require\\.js(\\?.*)?$/, '');"
    " window.__jupyter_widgets_assets_path__ = dir + '/';"
    " window.require.config({paths: {"
    "'@jupyter-widgets/html-manager/dist': dir, '@jupyter-widgets/html-manager': dir + '/html-manager',"
    " '@jupyter-widgets/base': dir + '/base', '@jupyter-widgets/controls': dir + '/controls'}});"
    " })();"
)


def vendored_widget_scripts() -> dict[str, dict[str, str]]:
    """myst-nb's `nb_ipywidgets_js` value: script path (relative to _static) -> tag attributes.

    The empty path is an inline script (Sphinx renders a script with only a body). Order matters:
    the scripts run in this order on the page.
    """
    return {
        REQUIRE_JS: {},
        "": {"body": _MODULE_PATHS_SCRIPT},
        # Widgets from third-party packages are not bundled; online they still come from the CDN.
        EMBED_JS: {"data-jupyter-widgets-cdn": "https://cdn.jsdelivr.net/npm/"},
    }


def _use_vendored_files(app, config) -> None:
    missing = [p for p in (REQUIRE_JS, EMBED_JS, MATHJAX_JS) if not (VENDOR_DIR / p).is_file()]
    if missing:
        raise FileNotFoundError(f"vendored JavaScript missing under {VENDOR_DIR}: {missing}")
    config.html_static_path = [*config.html_static_path, str(VENDOR_DIR)]
    config.nb_ipywidgets_js = vendored_widget_scripts()
    config.mathjax_path = MATHJAX_JS  # relative to _static/


def setup(app):
    # priority > 500: run after myst-nb and Sphinx have set their defaults.
    app.connect("config-inited", _use_vendored_files, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
