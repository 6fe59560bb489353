import asyncio
import logging
import os

import pytest

from epp.fleet.datastore import Datastore
from epp.fleet.reload import FileWatcher
from epp.fleet.static_source import StaticConfigError, apply_static, parse_static_text
from tests.support.wait import until

GOOD_A = """
pools:
- name: llama
  endpoints:
  - {address: 10.0.0.1, port: 8000}
"""
GOOD_B = """
pools:
- name: llama
  endpoints:
  - {address: 10.0.0.1, port: 8000}
  - {address: 10.0.0.2, port: 8000}
"""
BAD_PORT = """
pools:
- name: llama
  endpoints:
  - {address: 10.0.0.9, port: 99999}
"""
BAD_YAML = "pools: [ {name: llama, endpoints: [\n"


def _write(path, text, bump):
    path.write_text(text)
    # make sure the mtime differs even on coarse-grained filesystems
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump * 1_000_000))


def _keys(ds):
    return [e.key for e in ds.snapshot("llama").endpoints]


@pytest.fixture
def setup(tmp_path):
    path = tmp_path / "endpoints.yaml"
    _write(path, GOOD_A, 0)
    ds = Datastore()
    applied = []

    def apply(parsed):
        applied.append(parsed)
        apply_static(ds, *parsed)

    w = FileWatcher(path, parse=lambda text: parse_static_text(text, str(path)), apply=apply, interval=0.02)
    return path, ds, applied, w


async def test_good_reload_applies(setup):
    path, ds, applied, w = setup
    await w.load_initial()
    assert _keys(ds) == ["10.0.0.1:8000"] and ds.synced
    assert not await w.check_once()  # unchanged
    _write(path, GOOD_B, 1)
    assert await w.check_once()
    assert _keys(ds) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert w.reloads == 2 and len(applied) == 2


async def test_bad_reload_is_rejected_and_old_config_keeps_serving(setup, caplog):
    path, ds, applied, w = setup
    await w.load_initial()
    for i, bad in enumerate((BAD_PORT, BAD_YAML), start=1):
        with caplog.at_level(logging.ERROR, logger="epp.fleet.reload"):
            _write(path, bad, i)
            assert not await w.check_once()
        assert _keys(ds) == ["10.0.0.1:8000"]
        assert len(applied) == 1
        assert "rejected" in caplog.text
    assert w.failures == 2 and "Error" in (w.last_error or "")
    # same broken content again (only mtime changes): not re-reported
    _write(path, BAD_YAML, 5)
    assert not await w.check_once()
    assert w.failures == 2
    # fixing the file recovers
    _write(path, GOOD_B, 6)
    assert await w.check_once()
    assert _keys(ds) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert w.last_error is None


async def test_touch_without_content_change_does_not_reapply(setup):
    path, ds, applied, w = setup
    await w.load_initial()
    _write(path, GOOD_A, 3)
    assert not await w.check_once()
    assert len(applied) == 1


async def test_invalid_initial_config_raises(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(BAD_PORT)
    w = FileWatcher(path, parse=parse_static_text, apply=lambda p: None)
    with pytest.raises(StaticConfigError, match="port"):
        await w.load_initial()


async def test_missing_file_keeps_old_config(setup):
    path, ds, applied, w = setup
    await w.load_initial()
    path.unlink()
    assert not await w.check_once()
    assert "cannot read" in (w.last_error or "")
    assert _keys(ds) == ["10.0.0.1:8000"]


async def test_background_loop_picks_up_changes_and_async_apply(tmp_path):
    path = tmp_path / "c.yaml"
    _write(path, GOOD_A, 0)
    seen = []

    async def apply(parsed):
        await asyncio.sleep(0)
        seen.append(len(parsed[0][0][1]))

    w = FileWatcher(path, parse=parse_static_text, apply=apply, interval=0.02)
    await w.load_initial()
    w.start()
    try:
        _write(path, BAD_PORT, 1)
        await until(lambda: w.failures >= 1, 5, "the watcher to reject the bad version")
        _write(path, GOOD_B, 2)
        await until(lambda: seen[-1] == 2, 2, "the good version applied")
    finally:
        await w.stop()
    assert seen == [1, 2]
    assert w.failures == 1
