import random
from collections import Counter

from epp.fleet.rewrites import RewriteRule, RewriteTarget, choose_rewrite, find_rule


def _rule(targets, exact=(), created=0.0, name="ns/r", index=0):
    return RewriteRule(
        targets=tuple(RewriteTarget(m, w) for m, w in targets),
        exact=frozenset(exact),
        created=created,
        name=name,
        index=index,
    )


def test_no_rules_means_no_rewrite():
    assert choose_rewrite([], "llama", random.Random(0)) is None


def test_exact_match_rewrites_and_others_do_not():
    rules = [_rule([("llama-v2", 1)], exact=["llama"])]
    assert choose_rewrite(rules, "llama", random.Random(0)) == "llama-v2"
    assert choose_rewrite(rules, "mistral", random.Random(0)) is None


def test_generic_rule_matches_everything():
    rules = [_rule([("default-model", 1)])]
    assert choose_rewrite(rules, "anything", random.Random(0)) == "default-model"


def test_exact_beats_generic_even_when_generic_is_older():
    rules = [
        _rule([("generic", 1)], created=1.0, name="ns/old"),
        _rule([("exact", 1)], exact=["llama"], created=100.0, name="ns/new"),
    ]
    assert choose_rewrite(rules, "llama", random.Random(0)) == "exact"
    assert choose_rewrite(rules, "other", random.Random(0)) == "generic"


def test_oldest_rule_wins_within_same_kind():
    rules = [
        _rule([("newer", 1)], exact=["m"], created=200.0, name="ns/b"),
        _rule([("older", 1)], exact=["m"], created=100.0, name="ns/a"),
    ]
    assert find_rule(rules, "m").targets[0].model == "older"
    # Same creation time: name then index decide, deterministically.
    tied = [
        _rule([("second", 1)], exact=["m"], created=5.0, name="ns/a", index=1),
        _rule([("first", 1)], exact=["m"], created=5.0, name="ns/a", index=0),
    ]
    assert choose_rewrite(tied, "m", random.Random(0)) == "first"


def test_weighted_split_follows_weights():
    rules = [_rule([("v1", 90), ("v2", 10)], exact=["m"])]
    rng = random.Random(42)
    counts = Counter(choose_rewrite(rules, "m", rng) for _ in range(20000))
    share = counts["v2"] / 20000
    assert 0.08 < share < 0.12, counts


def test_zero_weight_target_never_chosen_and_all_zero_is_uniform():
    rules = [_rule([("v1", 0), ("v2", 5)], exact=["m"])]
    rng = random.Random(1)
    assert {choose_rewrite(rules, "m", rng) for _ in range(500)} == {"v2"}
    allzero = [_rule([("a", 0), ("b", 0)], exact=["m"])]
    seen = Counter(choose_rewrite(allzero, "m", rng) for _ in range(2000))
    assert set(seen) == {"a", "b"} and min(seen.values()) > 800


def test_rule_without_targets_is_skipped():
    rules = [_rule([], exact=["m"], created=0.0), _rule([("fallback", 1)], created=10.0)]
    assert choose_rewrite(rules, "m", random.Random(0)) == "fallback"


def test_deterministic_under_seed():
    rules = [_rule([("a", 1), ("b", 1), ("c", 1)])]
    seq1 = [choose_rewrite(rules, "x", random.Random(7)) for _ in range(3)]
    seq2 = [choose_rewrite(rules, "x", random.Random(7)) for _ in range(3)]
    assert seq1 == seq2
