"""The dashboard in a real headless browser (Debian's chromium + chromium-driver via selenium) against the real
local stack (`epp stack`: modelsim + Pointsman + Envoy). Skipped only when chromium cannot be installed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import orjson
import pytest

from epp.stack.ports import free_port, wait_port
from tests.support.browser import SKIP_REASON, chromium_paths, console_errors, start_chromium, stop_chromium
from tests.support.localstack import MODEL, LocalStack
from tests.support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.envoy, pytest.mark.slow]


GIE_DEFAULT = Path(__file__).resolve().parents[2] / "deploy" / "profiles" / "gie-default.yaml"


@pytest.fixture(scope="module")
def stack():
    s = LocalStack(config_file=str(GIE_DEFAULT))  # three weighted scorers: per-plugin detail worth showing
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    if chromium_paths() is None:
        pytest.skip(SKIP_REASON)
    drv = start_chromium()
    yield drv
    stop_chromium(drv)


def wait_for(drv, css: str, timeout: float = 10.0, count: int = 1):
    """The elements matching css, once there are `count` of them."""
    from selenium.webdriver.common.by import By

    wait_until(lambda: len(drv.find_elements(By.CSS_SELECTOR, css)) >= count, timeout, f"{count} x {css}", 0.05)
    return drv.find_elements(By.CSS_SELECTOR, css)


def text_of(drv, css: str) -> str:
    """The text of the elements matching css, read in one step (the page re-renders live rows every second)."""
    return drv.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => e.innerText).join('\\n')", css)


def count_ticks(drv) -> None:
    """Count the page's live ticks from now on (window.__ticks): every tick redraws the fleet table's rows."""
    drv.execute_script(
        "window.__ticks = 0; new MutationObserver(() => { window.__ticks += 1; })"
        ".observe(document.querySelector('#fleet-table tbody'), {childList: true});")


def ticks(drv) -> int:
    return drv.execute_script("return window.__ticks || 0;")


def wait_ticks(drv, n: int, timeout: float = 10.0, extra=lambda d: True) -> None:
    wait_until(lambda: ticks(drv) >= n and extra(drv), timeout, f"{n} live ticks", 0.05)


def click(drv, css: str) -> None:
    assert drv.execute_script("const e = document.querySelector(arguments[0]); if (e) e.click(); return !!e;", css)


def save_screenshot(drv, directory: Path, name: str, capsys) -> Path:
    path = directory / name
    assert drv.save_screenshot(str(path)), "chromium took no screenshot"
    assert path.stat().st_size > 20_000
    with capsys.disabled():
        print(f"\ndashboard screenshot for review: {path}")
    return path


def test_the_page_loads_live_with_no_console_errors(stack, browser):
    browser.get(stack.dashboard)
    wait_for(browser, "#live.pill-ok")
    wait_for(browser, ".uplot", count=5)  # all five charts drew
    count_ticks(browser)
    wait_ticks(browser, 2)  # a few live ticks
    assert console_errors(browser) == []
    browser.execute_script("console.error('probe: the console log is read')")
    assert any("probe: the console log is read" in e for e in console_errors(browser))


def test_the_fleet_table_shows_the_stacks_endpoints(stack, browser):
    browser.get(stack.dashboard)
    wait_for(browser, "#fleet-table tbody tr", count=2)
    text = text_of(browser, "#fleet-table tbody tr")
    for i, port in enumerate(tuple(stack.sim_ports)):
        assert f"127.0.0.1:{port}" in text and f"sim-{i}" in text
    wait_for(browser, "#fleet-table tbody tr td .pill-ok", count=2)  # both scraped and fresh


def test_a_request_through_envoy_appears_in_the_decisions_within_2s(stack, browser, tmp_path_factory, capsys):
    browser.get(stack.dashboard)
    wait_for(browser, "#live.pill-ok")
    rid = f"browser-{uuid.uuid4()}"
    t0 = time.monotonic()
    got = stack.chat("Which endpoint takes this one? " * 4, request_id=rid)
    row = f'#dec-table tbody tr[title^="request {rid}"]'
    wait_for(browser, row, timeout=2.0)
    elapsed = time.monotonic() - t0
    assert elapsed <= 2.0
    text = text_of(browser, row)
    assert f"127.0.0.1:{got['port']}" in text and MODEL in text
    click(browser, row)
    wait_for(browser, "#detail-body table.scores")
    text = text_of(browser, "#detail-body table.scores")
    for scorer in ("queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "total"):
        assert scorer in text
    assert f"127.0.0.1:{stack.sim_ports[0]}" in text and f"127.0.0.1:{stack.sim_ports[1]}" in text
    save_screenshot(browser, tmp_path_factory.mktemp("dashboard"), "decision-detail.png", capsys)
    browser.find_element("css selector", "#detail-close").click()
    assert console_errors(browser) == []


def test_explain_renders_scores_for_a_pasted_body_as_a_dry_run(stack, browser):
    browser.get(stack.dashboard)
    wait_for(browser, "#fleet-table tbody tr", count=2)
    seq = stack.api("api/decisions")["seq"]
    body = browser.find_element("css selector", "#ex-body")
    body.clear()
    body.send_keys(orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "explain me"}]}).decode())
    browser.find_element("css selector", "#ex-headers").send_keys("x-gateway-inference-objective: batch")
    browser.find_element("css selector", "#ex-go").click()
    wait_for(browser, "#ex-result table.scores")
    table = text_of(browser, "#ex-result table.scores")
    for scorer in ("queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "total"):
        assert scorer in table
    assert f"127.0.0.1:{stack.sim_ports[0]}" in table and f"127.0.0.1:{stack.sim_ports[1]}" in table
    cli = browser.find_element("css selector", "#ex-result pre.cli").text
    assert cli.startswith(f"model '{MODEL}' -> target '{MODEL}'") and "scorer prefix-cache-scorer" in cli
    assert stack.api("api/decisions")["seq"] == seq, "explain must not record a decision"
    body.clear()
    body.send_keys("{broken")
    browser.find_element("css selector", "#ex-go").click()
    (err,) = wait_for(browser, "#ex-result .error-box")
    assert "status 400" in err.text and "BadRequest" in err.text
    assert console_errors(browser) == []


def test_screenshot_with_the_stack_under_load(stack, browser, tmp_path_factory, capsys):
    stop = threading.Event()

    def load(worker: int) -> None:
        i = 0
        while not stop.is_set():
            stack.chat(f"Shared system prompt for tenant {worker % 3}. " * 6 + f"question {i}", stream=i % 2 == 0,
                       max_tokens=16)
            i += 1

    threads = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(4)]
    for t in threads:
        t.start()
    try:
        browser.get(stack.dashboard)
        wait_for(browser, "#dec-table tbody tr", count=20, timeout=20)
        count_ticks(browser)  # live ticks drawing the load: the charts and the request rate show it
        wait_ticks(browser, 2, extra=lambda d: float(text_of(d, "#st-rate") or 0) > 0)
        path = save_screenshot(browser, tmp_path_factory.mktemp("dashboard"), "dashboard-under-load.png", capsys)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert path.exists()
    assert console_errors(browser) == []


def test_a_token_protected_page_signs_in_in_the_browser(browser, tmp_path):
    token = f"tok-{uuid.uuid4().hex}"
    eps = tmp_path / "eps.yaml"
    eps.write_text("pools:\n- name: pool\n  endpoints:\n  - {address: 10.0.0.1, port: 8000, models: [llama]}\n")
    metrics, grpc_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "epp.cmd.cli", "serve", "--secure-serving=false", "--grpc-host", "127.0.0.1", "--grpc-port", str(grpc_port),
         "--grpc-health-port", "0", "--metrics-port", str(metrics), "--endpoints-file", str(eps), "-v", "3"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "POINTSMAN_DASHBOARD_TOKEN": token},
    )
    try:
        wait_port(metrics, proc=proc, what="Pointsman")
        browser.get(f"http://127.0.0.1:{metrics}/")
        wait_for(browser, "#token")[0].send_keys("not-the-token")
        click(browser, "#signin")
        # The sign-in form is drawn again with the answer: read it in one step, never through a stale element.
        wait_until(lambda: "not right" in text_of(browser, "p"), 10, "the sign-in's answer", 0.05)
        wait_for(browser, "#token")[0].send_keys(token)
        click(browser, "#signin")
        wait_for(browser, "#fleet-table tbody tr")
        assert "10.0.0.1:8000" in text_of(browser, "#fleet-table tbody tr")
        wait_for(browser, "#live.pill-ok")
        # The 401s of the wrong sign-in are the only console noise; the signed-in page has none.
        assert [e for e in console_errors(browser) if "401" not in e] == []
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert "dashboard on port" in out and token not in out
