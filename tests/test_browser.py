"""Open every page of the built book in headless Chromium, as a reader offline would.

For each page: no JavaScript exception, no console error and no failed request except requests to
other hosts (the browser is made to resolve no host but 127.0.0.1, so every CDN request fails, as
it would offline), every image (plots included) decoded, widgets rendered from the vendored
JavaScript, math typeset by the vendored MathJax, and on notebook pages the Binder and Colab
launch buttons. A full-page screenshot of
each page is saved under _build/screenshots/ for a person to look at.

Needs Debian's `chromium` (the Makefile's `browser` step installs it as root); skipped without it.
"""

import functools
import http.server
import re
import sys
import threading
import urllib.request
from urllib.parse import urlparse

import pytest
from book_build import REPO, built_book, missing_toc_files, toc_files
from chromium_cdp import Chromium, find_chromium

pytestmark = pytest.mark.slow

SCREENSHOTS = REPO / "_build" / "screenshots"
PAGES = toc_files() + [f"exercises/{p.stem}" for p in sorted((REPO / "exercises").glob("*.ipynb"))]
NOTEBOOK_PAGES = {p for p in PAGES if (REPO / f"{p}.ipynb").is_file()}
SERVER_HOST = "127.0.0.1"

# Resolves once every image has loaded or failed, every saved widget view has been drawn
# (html-manager inserts a .widget-subarea before each view it renders) and MathJax has typeset
# the page, or after 20 s.
WAIT_FOR_PAGE = """
new Promise(resolve => {
  const started = Date.now();
  (async function poll() {
    const views = document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length;
    const drawn = document.querySelectorAll('.widget-subarea').length;
    const images = Array.from(document.images).every(img => img.complete);
    const mathjax = window.MathJax && window.MathJax.startup && window.MathJax.startup.promise;
    const math = document.querySelectorAll('.math').length;
    const typeset = !math || Boolean(mathjax);
    if ((images && drawn >= views && typeset) || Date.now() - started > 20000) {
      if (mathjax) await window.MathJax.startup.promise;
      resolve({views, drawn, math, rendered: document.querySelectorAll('mjx-container').length,
               math_errors: document.querySelectorAll('mjx-merror').length});
    } else setTimeout(poll, 200);
  })();
})
"""
BROKEN_IMAGES = """
Array.from(document.images)
  .filter(img => !(img.complete && img.naturalWidth > 0))
  .map(img => img.currentSrc || img.src)
"""
LAUNCH_LINKS = """
Array.from(document.querySelectorAll('a[href]')).map(a => a.href)
  .filter(h => h.startsWith('https://mybinder.org/') || h.startsWith('https://colab.research.google.com/'))
"""
# The download menu's links to the page's notebook, as absolute URLs of the local server.
DOWNLOAD_LINKS = """
Array.from(document.querySelectorAll('a[href]')).map(a => a.href)
  .filter(h => h.includes('/_sources/') && h.endsWith('.ipynb'))
"""
LAUNCH_PATH = re.compile(r"(?:urlpath=lab/tree/|/blob/[^/]+/)(?P<path>[^?#]+\.ipynb)$")


def repository_file_of(link: str) -> str:
    """The repository path a Binder or Colab launch link opens."""
    match = LAUNCH_PATH.search(link)
    assert match, f"a launch link that opens no notebook: {link}"
    return match["path"]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # a browser that closes a connection it no longer needs is not an error of the site
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@pytest.fixture(scope="module")
def site_url():
    if find_chromium() is None:
        pytest.skip(
            "Chromium is not installed (Debian: apt-get install chromium; `make test` does it as root)"
        )
    if missing_toc_files():
        pytest.fail(f"_toc.yml lists pages that do not exist yet: {missing_toc_files()}")
    build = built_book()
    if build.returncode != 0:
        pytest.fail("the book build failed (see test_book.py and _build/book-build.log)")
    handler = functools.partial(_QuietHandler, directory=str(build.html_dir))
    server = _QuietServer((SERVER_HOST, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://{SERVER_HOST}:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser(site_url):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with Chromium(find_chromium()) as chromium:
        yield chromium


def is_local(url: str) -> bool:
    return urlparse(url.split(" ", 1)[0]).hostname in (SERVER_HOST, None)


def local_errors(report) -> list[str]:
    """Console errors and failed requests that concern this site (other hosts are blocked)."""
    errors = []
    for failure in report.failed_requests:
        if is_local(failure) and not failure.split(" ", 1)[0].endswith("/favicon.ico"):
            errors.append(f"request failed: {failure}")
    for message in report.console_errors:
        source = message.rsplit("[", 1)[-1].rstrip("]") if message.endswith("]") else ""
        blocked = "Failed to load resource" in message and source and not is_local(source)
        if not blocked and not source.endswith("/favicon.ico"):
            errors.append(f"console: {message}")
    return errors


@pytest.mark.parametrize("page", PAGES)
def test_page_in_browser(browser, site_url, page):
    tab = browser.open(f"{site_url}/{page}.html")
    try:
        state = tab.evaluate(WAIT_FOR_PAGE, await_promise=True)
        browser.pump(0.5)  # late console messages
        tab.screenshot(str(SCREENSHOTS / f"{page.replace('/', '__')}.png"))
        report = tab.report()
        broken_images = tab.evaluate(BROKEN_IMAGES)
        launch_links = tab.evaluate(LAUNCH_LINKS)
        download_links = tab.evaluate(DOWNLOAD_LINKS)
        title = tab.evaluate(
            "document.querySelector('h1') ? document.querySelector('h1').textContent : ''"
        )
    finally:
        tab.close()

    assert not report.exceptions, f"JavaScript exceptions on {page}: {report.exceptions}"
    assert not local_errors(report), f"errors on {page}: {local_errors(report)}"
    assert not broken_images, f"images that did not load on {page}: {broken_images}"
    assert state["drawn"] >= state["views"], (
        f"{page}: {state['drawn']} of {state['views']} widgets drawn"
    )
    assert state["rendered"] >= state["math"], (
        f"{page}: {state['rendered']} of {state['math']} formulas typeset"
    )
    assert not state["math_errors"], (
        f"{page}: {state['math_errors']} formulas MathJax could not parse"
    )
    assert title.strip(), f"{page} has no title"
    for link in launch_links:  # every launch button opens a notebook the repository has
        path = repository_file_of(link)
        assert (REPO / path).is_file(), (
            f"{page}: {link} opens {path}, which is not in the repository"
        )
    for link in download_links:  # and the download menu offers one the site serves
        with urllib.request.urlopen(link) as response:
            assert response.status == 200, f"{page}: the download link {link} leads nowhere"
    if page in NOTEBOOK_PAGES:
        assert download_links, f"{page} offers no notebook download"
        assert any(link.startswith("https://mybinder.org/v2/gh/") and link.endswith(f"{page}.ipynb")
                   for link in launch_links), f"no Binder button on {page}: {launch_links}"  # fmt: skip
        assert any(link.startswith("https://colab.research.google.com/github/") and link.endswith(f"{page}.ipynb")
                   for link in launch_links), f"no Colab button on {page}: {launch_links}"  # fmt: skip
