import pytest
from expositions import sglang_exposition, triton_exposition, trtllm_exposition, vllm_exposition
from prometheus_client.parser import text_string_to_metric_families

from epp.fleet.scrape.parser import MetricsParseError, labels, parse_metrics, parser_for, samples


def test_vllm_load_series_and_cache_geometry():
    m = parse_metrics(vllm_exposition(waiting=7, running=12, kv=0.4375, block_size=32, num_gpu_blocks=1234), "vllm", 5.0)
    assert (m.waiting, m.running, m.kv_usage) == (7, 12, pytest.approx(0.4375))
    assert (m.block_size, m.num_gpu_blocks) == (32, 1234)
    assert m.updated_at == 5.0 and not m.stale
    assert m.active_loras == frozenset() and m.max_lora == 0


def test_vllm_legacy_kv_name():
    m = parse_metrics(vllm_exposition(kv=0.25, legacy_kv_name=True), "vllm", 0.0)
    assert m.kv_usage == pytest.approx(0.25)


def test_vllm_data_parallel_sums_queues_and_averages_kv():
    m = parse_metrics(vllm_exposition(waiting=3, running=5, kv=0.5, engines=4), "vllm", 0.0)
    assert (m.waiting, m.running, m.kv_usage) == (12, 20, pytest.approx(0.5))


def test_vllm_lora_newest_series_wins_regardless_of_order():
    lora = [
        (1732390000.5, "old-a,old-b", ""),
        (1732390100.25, "sql-lora, chat-lora", "tweet-lora"),  # newest: current
        (1732390050.0, "mid", "mid-w"),
    ]
    m = parse_metrics(vllm_exposition(lora=lora, max_lora=3), "vllm", 0.0)
    assert m.active_loras == {"sql-lora", "chat-lora"}
    assert m.waiting_loras == {"tweet-lora"}
    assert m.max_lora == 3


def test_sglang():
    m = parse_metrics(sglang_exposition(waiting=4, running=9, usage=0.61, page_size=16, num_pages=5000), "sglang", 1.0)
    assert (m.waiting, m.running, m.kv_usage) == (4, 9, pytest.approx(0.61))
    assert (m.block_size, m.num_gpu_blocks) == (16, 5000)


def test_trtllm_serve():
    m = parse_metrics(trtllm_exposition(waiting=2, running=6, util=0.3, tokens_per_block=64, max_blocks=900), "trtllm-serve", 1.0)
    assert (m.waiting, m.running, m.kv_usage) == (2, 6, pytest.approx(0.3))
    assert (m.block_size, m.num_gpu_blocks) == (64, 900)


def test_triton_selects_by_label():
    m = parse_metrics(triton_exposition(waiting=3, scheduled=8, fraction=0.72, tokens_per=128, max_blocks=4000), "triton", 1.0)
    assert (m.waiting, m.running, m.kv_usage) == (3, 8, pytest.approx(0.72))
    assert (m.block_size, m.num_gpu_blocks) == (128, 4000)


def test_wrong_engine_is_an_error_not_zeros():
    with pytest.raises(MetricsParseError, match="sglang"):
        parse_metrics(vllm_exposition(waiting=3), "sglang", 0.0)
    with pytest.raises(KeyError, match="unknown engine"):
        parser_for("tgi")


def test_exact_name_not_prefix_and_unlabelled_and_first_line():
    text = (
        b"vllm:num_requests_waiting 4\n"  # first line, no labels
        b"vllm:num_requests_waiting_extra{a=\"b\"} 100\n"  # a different metric sharing the prefix
        b"# HELP vllm:num_requests_running running\n"
        b"vllm:num_requests_running{model_name=\"x}y\"} 2 1732390000000\r\n"  # brace in a label, timestamp, CRLF
        b"vllm:kv_cache_usage_perc{} 0.5"  # no trailing newline
    )
    assert samples(text, b"vllm:num_requests_waiting") == [(b"", 4.0)]
    m = parse_metrics(text, "vllm", 0.0)
    assert (m.waiting, m.running, m.kv_usage) == (4, 2, 0.5)


def test_label_escapes():
    assert labels(b'a="x\\"y",b="c,d"') == {"a": 'x"y', "b": "c,d"}


@pytest.mark.parametrize(
    "engine,text",
    [
        ("vllm", vllm_exposition(waiting=3, running=1, kv=0.2, engines=2)),
        ("sglang", sglang_exposition(waiting=5, running=2, usage=0.9)),
        ("trtllm-serve", trtllm_exposition(waiting=1, running=4, util=0.5)),
        ("triton", triton_exposition(waiting=6, scheduled=2, fraction=0.1)),
    ],
)
def test_agrees_with_prometheus_client(engine, text):
    """Cross-check against the reference parser: the fixtures are valid expositions and the numbers match."""
    fams = {f.name: f for f in text_string_to_metric_families(text.decode())}
    vals: dict[str, list] = {}
    for f in fams.values():
        for s in f.samples:
            vals.setdefault(s.name, []).append(s)
    m = parse_metrics(text, engine, 0.0)
    names = {
        "vllm": ("vllm:num_requests_waiting", "vllm:num_requests_running"),
        "sglang": ("sglang:num_queue_reqs", "sglang:num_running_reqs"),
        "trtllm-serve": ("trtllm_num_requests_waiting", "trtllm_num_requests_running"),
    }
    if engine in names:
        w, r = names[engine]
        assert m.waiting == sum(s.value for s in vals[w])
        assert m.running == sum(s.value for s in vals[r])
    else:
        req = vals["nv_trt_llm_request_metrics"]
        assert m.waiting == sum(s.value for s in req if s.labels["request_type"] == "waiting")
        assert m.running == sum(s.value for s in req if s.labels["request_type"] == "scheduled")


def test_nan_and_inf_values_do_not_break_the_scrape():
    text = b"vllm:num_requests_waiting NaN\nvllm:num_requests_running +Inf\nvllm:kv_cache_usage_perc NaN\n"
    m = parse_metrics(text, "vllm", 0.0)
    assert (m.waiting, m.running, m.kv_usage) == (0, 0, 0.0)
