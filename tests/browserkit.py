"""A real headless Chromium for the page tests (the report's and the history's).

CI installs it with ``apt-get install -y chromium``; without it the tests that use it are skipped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
WINDOW = (1280, 800)  # a laptop's screen: the first screen a reader sees

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium with a fresh profile, no network chatter, logging to stderr."""
    cmd = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


# Measured once the page has loaded, written on <body> as data-* facts for --dump-dom to carry out.
PROBE = """<script>
window.addEventListener("load", function () {
  var data = document.body.dataset, imgs = Array.prototype.slice.call(document.images);
  data.imagesLoaded = imgs.every(function (i) { return i.complete && i.naturalWidth > 0; }) ? "yes" : "no";
  data.imageCount = String(imgs.length);
  data.changeRows = String(document.querySelectorAll("#changes tbody tr").length);
  data.scrollWidth = String(document.documentElement.scrollWidth);
  data.viewportWidth = String(window.innerWidth);
});
</script>"""


def body_facts(profile: Path, page: Path) -> dict[str, str]:
    """``page`` opened at ``WINDOW``: the ``data-*`` facts its script wrote on <body>."""
    done = chromium(
        profile, f"--window-size={WINDOW[0]},{WINDOW[1]}", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()
    )
    assert done.returncode == 0, done.stderr[-2000:]
    body = re.search(r"<body[^>]*>", done.stdout)
    assert body, done.stdout[:500]
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(0)))


def page_facts(profile: Path, page: Path) -> dict[str, str]:
    """A page without a script of its own, measured by ``PROBE``: a copy of it beside it (so its
    images resolve) with the probe in its head."""
    probe = page.with_name("probe.html")
    probe.write_text(page.read_text(encoding="utf-8").replace("</head>", PROBE + "</head>", 1), encoding="utf-8")
    return body_facts(profile, probe)
