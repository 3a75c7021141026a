"""Headless-Chromium screenshots of each TensorBoard dashboard over a logs folder.

    python scripts/tensorboard_screenshots.py logs docs/tensorboard [--width 1400 --height 900]

Starts TensorBoard on 127.0.0.1 (a free port), waits until it serves data, then saves one PNG per tab
(custom scalars, time series, HPARAMS, images, PR curves, graphs) with Chromium (Debian: ``apt-get install
chromium``), and stops TensorBoard. Used for the README's pictures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TABS = ["custom_scalars", "timeseries", "hparams", "images", "pr_curves", "graphs"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logdir")
    p.add_argument("out")
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--height", type=int, default=900)
    p.add_argument("--tabs", nargs="+", default=TABS)
    args = p.parse_args(argv)
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        print("error: no chromium found; apt-get install chromium", file=sys.stderr)
        return 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tb = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", args.logdir, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{base}/data/plugin/scalars/tags", timeout=5) as r:
                    if json.loads(r.read()):
                        break
            except OSError:
                time.sleep(0.5)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for tab in args.tabs:
            png = out / f"{tab}.png"
            subprocess.run(
                [
                    browser,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--hide-scrollbars",
                    f"--window-size={args.width},{args.height}",
                    "--virtual-time-budget=20000",
                    f"--screenshot={png.resolve()}",
                    f"{base}/#{tab}",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=120,
            )
            print(f"wrote {png}")
    finally:
        tb.terminate()
        tb.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
