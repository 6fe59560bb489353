"""The dashboard's receipts and shadow panels, and the title's scope pill, in a real headless browser against the
local stack (`epp stack --shadow-config`: modelsim + Pointsman + Envoy)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.api.test_dashboard_browser import click, save_screenshot, text_of, wait_for
from tests.support.browser import SKIP_REASON, chromium_paths, console_errors, start_chromium, stop_chromium
from tests.support.localstack import LocalStack

pytestmark = [pytest.mark.envoy, pytest.mark.slow]
PROFILES = Path(__file__).resolve().parents[2] / "deploy" / "profiles"


@pytest.fixture(scope="module")
def stack():
    s = LocalStack(config_file=str(PROFILES / "gie-default.yaml"),
                   shadow_config=str(PROFILES / "estimated-latency.yaml"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    if chromium_paths() is None:
        pytest.skip(SKIP_REASON)
    drv = start_chromium()
    yield drv
    stop_chromium(drv)


def test_the_empty_scope_pill_is_hidden(stack, browser):
    browser.get(stack.dashboard)
    wait_for(browser, "#live.pill-ok")
    wait_for(browser, "#cfg-body h3")  # the config (which sets the pill) has loaded
    assert browser.execute_script("const e = document.querySelector('#scope');"
                                  "return [e.hidden, getComputedStyle(e).display, e.getBoundingClientRect().width]"
                                  ) == [True, "none", 0]
    # A worker's page shows it (the rule only hides the empty pill).
    browser.execute_script("const e = document.querySelector('#scope'); e.hidden = false; e.textContent = 'w0';")
    assert browser.execute_script("return getComputedStyle(document.querySelector('#scope')).display") == "inline-block"


def test_a_receipt_is_looked_up_by_its_decision_id(stack, browser, tmp_path_factory, capsys):
    rid = f"receipt-{uuid.uuid4()}"
    got = stack.chat("Which endpoint takes this one? " * 4, request_id=rid)
    row = next(d for d in stack.api("api/decisions?since=0")["decisions"] if d["id"] == rid)
    did = row["decision_id"]
    assert did
    browser.get(stack.dashboard)
    wait_for(browser, "#live.pill-ok")
    browser.find_element("css selector", "#receipt-id").send_keys(did)
    click(browser, "#receipt-go")
    wait_for(browser, "#receipt-result table.scores")
    text = text_of(browser, "#receipt-result")
    assert f"Decision {did}" in text and f"127.0.0.1:{got['port']}" in text and rid in text
    for scorer in ("queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "total"):
        assert scorer in text
    assert "HTTP 200" in text
    browser.execute_script("document.querySelector('#receipts').scrollIntoView()")
    save_screenshot(browser, tmp_path_factory.mktemp("dashboard"), "receipt.png", capsys)
    browser.find_element("css selector", "#receipt-id").clear()
    browser.find_element("css selector", "#receipt-id").send_keys("000000-1")
    click(browser, "#receipt-go")
    wait_for(browser, "#receipt-result .error-box")
    assert "not made by this process" in text_of(browser, "#receipt-result")
    assert console_errors(browser) == []


def test_the_shadow_panel_reports_agreement_latency_and_moves(stack, browser, tmp_path_factory, capsys):
    for i in range(12):
        stack.chat(f"shadow request {i} " * 8)
    browser.get(stack.dashboard)
    wait_for(browser, "#shadow-endpoints tbody tr", timeout=15, count=2)
    text = text_of(browser, "#shadow-body")
    assert "agreement" in text and "estimated-latency.yaml" in text_of(browser, "#shadow-note")
    shadow = stack.api("api/shadow")
    assert shadow["shadowed"] >= 12
    assert f"({shadow['agree']} of {shadow['shadowed']})" in text or shadow["shadowed"] > 12  # it refreshes
    for port in stack.sim_ports:
        assert f"127.0.0.1:{port}" in text_of(browser, "#shadow-endpoints")
    assert "predicted" in text_of(browser, "#shadow-latency")
    browser.execute_script("document.querySelector('#shadow').scrollIntoView()")
    save_screenshot(browser, tmp_path_factory.mktemp("dashboard"), "shadow.png", capsys)
    assert console_errors(browser) == []
