import pytest

from epp.fleet.saturation import SaturationDetector, admit, detector_from_params
from scheduling.framework.params import parse_duration
from scheduling.types import Endpoint, Metrics

NOW = 1000.0


def ep(i, waiting=0, kv=0.0, age=0.0, stale=False, scraped=True):
    m = Metrics(waiting=waiting, kv_usage=kv, updated_at=(NOW - age) if scraped else None, stale=stale)
    return Endpoint(key=f"10.0.0.{i}:8000", address=f"10.0.0.{i}", port=8000, metrics=m)


def test_idle_pool_is_not_saturated():
    d = SaturationDetector()
    eps = [ep(1), ep(2)]
    assert d.saturation(eps, NOW) == 0.0
    assert d.admit(-1, eps, NOW)


def test_saturation_is_mean_of_max_ratio():
    d = SaturationDetector()
    # ep1: q 5/5 = 1.0 (kv 0.4/0.8 = 0.5) -> 1.0; ep2: kv 0.4/0.8 = 0.5 -> 0.5
    eps = [ep(1, waiting=5, kv=0.4), ep(2, kv=0.4)]
    assert d.saturation(eps, NOW) == pytest.approx(0.75)
    assert not d.saturated(eps, NOW)


def test_sheddable_requests_are_shed_under_saturation_and_others_pass():
    d = SaturationDetector()
    eps = [ep(1, waiting=10), ep(2, kv=0.8)]  # 2.0 and 1.0 -> 1.5
    assert d.saturated(eps, NOW)
    assert not d.admit(-1, eps, NOW)
    assert not admit(-5, eps, NOW)
    assert d.admit(0, eps, NOW)
    assert d.admit(10, eps, NOW)


def test_exactly_at_threshold_counts_as_saturated():
    eps = [ep(1, waiting=5), ep(2, kv=0.8)]
    assert SaturationDetector().saturation(eps, NOW) == pytest.approx(1.0)
    assert not admit(-1, eps, NOW)


def test_stale_and_unscraped_endpoints_count_as_full():
    d = SaturationDetector()
    # one idle fresh endpoint, one older than 200 ms
    eps = [ep(1), ep(2, age=0.25)]
    assert d.saturation(eps, NOW) == pytest.approx(0.5)
    eps = [ep(1, age=0.19), ep(2, stale=True), ep(3, scraped=False)]
    assert d.saturation(eps, NOW) == pytest.approx(2 / 3)
    all_stale = [ep(1, age=5), ep(2, age=5)]
    assert not d.admit(-1, all_stale, NOW)


def test_no_endpoints_is_saturated():
    assert SaturationDetector().saturation([], NOW) == 1.0
    assert not admit(-1, [], NOW)
    assert admit(0, [], NOW)


def test_headroom_raises_the_bar():
    d = SaturationDetector(headroom=0.5)
    eps = [ep(1, waiting=6), ep(2, waiting=6)]  # 1.2
    assert d.admit(-1, eps, NOW)
    eps = [ep(1, waiting=8), ep(2, waiting=8)]  # 1.6
    assert not d.admit(-1, eps, NOW)


def test_params_and_validation():
    d = detector_from_params({"queueDepthThreshold": 10, "kvCacheUtilThreshold": 0.9, "metricsStalenessThreshold": "500ms"})
    assert d.queue_depth_threshold == 10 and d.kv_cache_util_threshold == 0.9
    assert d.metrics_staleness_s == pytest.approx(0.5)
    assert detector_from_params(None) == SaturationDetector()
    with pytest.raises(ValueError, match="unknown parameter"):
        detector_from_params({"queueDepth": 3})
    assert detector_from_params({"headroom": "0.25"}).headroom == 0.25
    with pytest.raises(ValueError, match="queueDepthThreshold must be a number"):
        detector_from_params({"queueDepthThreshold": [5]})
    with pytest.raises(ValueError, match="kvCacheUtilThreshold"):
        SaturationDetector(kv_cache_util_threshold=0)
    assert parse_duration("2s") == 2.0 and parse_duration(0.1) == 0.1
    with pytest.raises(ValueError):
        parse_duration("soon")
