"""Debian's chromium + chromium-driver through selenium, headless, for the dashboard's browser tests.

`scripts/debian-packages.sh` (called by the test command) installs both packages when missing; when they still
cannot be found the browser tests skip and say that chromium could not be installed.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps",
    "--disable-extensions", "--no-default-browser-check", "--metrics-recording-only", "--mute-audio",
)


def chromium_paths() -> tuple[str, str] | None:
    """(chromium, chromedriver) from Debian's packages, or None when either is missing."""
    browser = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    driver = shutil.which("chromedriver") or (
        "/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists() else None)
    return (browser, driver) if browser and driver else None


SKIP_REASON = ("chromium and chromium-driver could not be installed (scripts/debian-packages.sh needs apt-get as "
               "root and Debian's package archive), so the browser tests cannot run")


def start_chromium(width: int = 1600, height: int = 1400):
    """A fresh headless chromium (its own --user-data-dir) driven by selenium; the caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    paths = chromium_paths()
    if paths is None:
        raise RuntimeError(SKIP_REASON)
    browser, driver = paths
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for flag in CHROMIUM_FLAGS:
        opts.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="pointsman-chromium-")
    opts.add_argument(f"--user-data-dir={profile}")
    opts.add_argument(f"--window-size={width},{height}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(executable_path=driver), options=opts)
    drv._pointsman_profile = profile  # removed by stop_chromium
    return drv


def stop_chromium(drv) -> None:
    try:
        drv.quit()
    finally:
        shutil.rmtree(getattr(drv, "_pointsman_profile", ""), ignore_errors=True)


def console_errors(drv) -> list[str]:
    """Browser console entries at SEVERE level since the last call (failed loads, JS errors, CSP violations)."""
    return [f"{e.get('source')}: {e.get('message')}" for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
