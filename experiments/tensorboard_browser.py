"""What a user sees on opening a sweep's TensorBoard, checked in a browser.

A real `tensorboard --logdir` server, and each dashboard opened as a user
opens it (no run picked by hand) in headless chromium (Debian's `chromium`
package, driven by Playwright): a dashboard passes when this sweep's content
is drawn on it, which needs its runs selected by default and its data
loaded. A screenshot of each is kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Iterator

CHROMIUM = "chromium"  # Debian's package; `apt-get install chromium`

# dashboard -> (text drawn only with this sweep's data, an element that must
# load: an image the dashboard fetched, or None)
DASHBOARDS = {
    "timeseries": ("memory/peak_gib", "img[src*='imageData']"),
    "custom_scalars": ("perf/mfu over batch", None),
    "images": ("perf/mfu_heatmap", "img[src*='individualImage']"),
    "text": ("recommended: mesh", None),
    "hparams": ("perf/tokens_per_s", None),
}


@dataclasses.dataclass(frozen=True)
class Dashboard:
  name: str
  ok: bool
  screenshot: str
  missing: str = ""  # what was not drawn


def chromium() -> str | None:
  """The chromium executable, or None when it is not installed."""
  return shutil.which(CHROMIUM)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def serve(logdir: str, timeout_s: float = 60) -> Iterator[str]:
  """`tensorboard --logdir logdir` on a free local port; yields its URL once
  it lists runs. The TensorBoard of this interpreter (its `tensorboard.main`
  module), not whichever `tensorboard` is first on PATH."""
  port = _free_port()
  proc = subprocess.Popen(
      [sys.executable, "-m", "tensorboard.main", "--logdir", logdir,
       "--host", "127.0.0.1", "--port", str(port)],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  base = f"http://127.0.0.1:{port}"
  try:
    deadline = time.time() + timeout_s
    while True:
      try:
        with urllib.request.urlopen(base + "/data/runs", timeout=5) as r:
          if json.loads(r.read()):
            break
      except OSError:
        pass
      if time.time() > deadline or proc.poll() is not None:
        raise RuntimeError(f"tensorboard --logdir {logdir} did not come up")
      time.sleep(0.5)
    yield base
  finally:
    proc.kill()
    proc.wait(timeout=10)


def check(base: str, out_dir: str, timeout_s: float = 30,
          names: tuple[str, ...] = tuple(DASHBOARDS)) -> list[Dashboard]:
  """Opens each of DASHBOARDS `names` at `base`; screenshots go to
  out_dir."""
  from playwright.sync_api import Error, sync_playwright
  os.makedirs(out_dir, exist_ok=True)
  results = []
  with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=chromium(),
                                args=["--no-sandbox"])
    try:
      page = browser.new_page(viewport={"width": 1400, "height": 1000})
      for name in names:
        text, element = DASHBOARDS[name]
        page.goto(f"{base}/#{name}")
        missing = ""
        try:
          page.get_by_text(text).filter(visible=True).first.wait_for(
              timeout=timeout_s * 1000)
          if element:
            page.locator(element).filter(visible=True).first.wait_for(
                timeout=timeout_s * 1000)
        except Error:
          missing = f"{text!r}" + (f" and {element}" if element else "")
        shot = os.path.join(out_dir, f"{name}.png")
        page.screenshot(path=shot)
        results.append(Dashboard(name, not missing, shot, missing))
    finally:
      browser.close()
  return results
