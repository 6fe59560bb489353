"""Agent sessions in the scheduler: identity, the session table's bounds, the move rule, keeping context warm,
forgetting a departed endpoint, and replication (scheduling/sessions, agent-session-scorer)."""

from __future__ import annotations

import random
import sys

from sched_helpers import ctx, ep, plugin, req

from scheduling.api import InflightLoad
from scheduling.config import load_scheduler
from scheduling.plugins.scorers.agent_session import SESSION, session_note
from scheduling.sessions.identity import IdentitySources, ResponseChains, identify
from scheduling.sessions.table import SessionTable
from scheduling.types import ApiKind, LLMRequest, SessionRef

SRC = IdentitySources()
SYSTEM = "you are an agent with tools. " * 80


def _req(body: dict | None = None, headers: dict | None = None, kind: ApiKind = ApiKind.CHAT, prompt: str = SYSTEM,
         rid: str = "r1") -> LLMRequest:
    return LLMRequest(rid, "m", "m", kind=kind, headers=headers or {}, prompt=prompt, body=body)


# ---- identity ---------------------------------------------------------------------------------------------------
def test_identity_sources_in_order() -> None:
    h, _ = identify(_req({"user": "u1"}, {"x-session-id": "s1"}), SRC)
    u, _ = identify(_req({"user": "u1"}), SRC)
    a, _ = identify(_req({"metadata": {"user_id": "anthropic-user"}}), SRC)
    k, _ = identify(_req({"prompt_cache_key": "pck", "user": "u1"}), SRC)
    assert h is not None and h.source == "header:x-session-id"
    assert u is not None and u.source == "user"
    assert a is not None and a.source == "metadata.user_id"
    assert k is not None and k.source == "prompt_cache_key"
    assert len({h.key, u.key, a.key, k.key}) == 4
    same, _ = identify(_req(None, {"x-session-id": "u1"}), SRC)
    assert same is not None and same.key == u.key  # one value, one session, whichever field carries it
    none, skipped = identify(_req({"messages": []}), SRC)
    assert none is None and skipped == []


def test_route_sources_come_first() -> None:
    ref, _ = identify(_req(None, {"x-session-id": "s1", "x-kthena-session": "k1"}), SRC,
                      extra=(("header", "x-kthena-session"),))
    assert ref is not None and ref.source == "route"


def test_hostile_values_are_skipped_not_fatal() -> None:
    huge = "x" * 1_000_000
    surrogate = "bad\udcff\ud800value"  # a header passed as raw bytes: lone surrogates
    ref, skipped = identify(_req({"user": {"nested": 1}, "metadata": "not an object"}, {"x-session-id": huge}), SRC)
    assert ref is None and skipped == ["header:x-session-id", "user"]
    ref, _ = identify(_req(None, {"x-session-id": surrogate}), SRC)
    assert ref is not None and ref.source == "header:x-session-id"
    ref, skipped = identify(_req({"user": True, "previous_response_id": ["x"]}), SRC)
    assert ref is None and skipped == ["previous_response_id", "user"]


def test_programs_follow_the_prompt_head_or_a_header() -> None:
    a, _ = identify(_req({"user": "a"}, prompt=SYSTEM + "task a"), SRC)
    b, _ = identify(_req({"user": "b"}, prompt=SYSTEM + "task b"), SRC)
    c, _ = identify(_req({"user": "c"}, prompt="another agent " * 200), SRC)
    assert a is not None and b is not None and c is not None
    assert a.program == b.program != c.program and a.program
    src = IdentitySources(program_header="x-program-id")
    d, _ = identify(_req({"user": "d"}, {"x-program-id": "p1"}, prompt="x"), src)
    e, _ = identify(_req({"user": "e"}, {"x-program-id": "p1"}, prompt="y"), src)
    assert d is not None and e is not None and d.program == e.program


def test_responses_chain_joins_the_session() -> None:
    chains = ResponseChains(capacity=4)
    first, _ = identify(_req({"input": "hi"}, kind=ApiKind.RESPONSES, rid="req-1"), SRC, chains=chains)
    assert first is not None and first.source == "responses"
    assert chains.learn("resp_1", first.key)
    nxt, _ = identify(_req({"input": "go on", "previous_response_id": "resp_1"}, kind=ApiKind.RESPONSES), SRC,
                      chains=chains)
    assert nxt is not None and nxt.key == first.key and nxt.source == "previous_response_id"
    unknown, _ = identify(_req({"previous_response_id": "resp_zz"}, kind=ApiKind.RESPONSES), SRC, chains=chains)
    assert unknown is not None and unknown.key != first.key
    for i in range(100):
        chains.learn(f"resp_{i + 2}", i)
    assert len(chains) == 4  # bounded
    assert not chains.learn("r" * 10_000, 1)


# ---- the table ----------------------------------------------------------------------------------------------
def _ref(i: int, program: int = 7) -> SessionRef:
    return SessionRef(1000 + i, "header:x-session-id", program)


def test_table_is_bounded_by_lru_and_ttl() -> None:
    dropped: list[int] = []
    t = SessionTable(max_sessions=100, ttl_s=30.0, on_drop=dropped.append)
    for i in range(5000):  # thousands of distinct values
        t.begin(_ref(i), "a:1", 100.0, now=i * 0.001)
    assert len(t) == 100 and len(dropped) == 4900
    t.begin(_ref(99_999), "a:1", 100.0, now=100.0)  # everything else went idle for longer than the TTL
    assert len(t) == 1
    assert sys.getsizeof(t._sessions) < 64 * 1024


def test_turns_gaps_and_parallel_calls() -> None:
    t = SessionTable(gap_alpha=0.5)
    s, new = t.begin(_ref(1), "a:1", 1000.0, now=0.0)
    assert new and s.turns == 1
    s, new = t.begin(_ref(1), "b:1", 1000.0, now=0.1)  # a parallel call, spread elsewhere
    assert not new and s.endpoint == "a:1" and s.turns == 1
    assert t.end(s.key, "b:1", 1.0) is None  # the turn still has a call in flight
    assert t.end(s.key, "a:1", 2.0) is s and s.ended == 2.0
    s, new = t.begin(_ref(1), "a:1", 1500.0, now=6.0)
    assert new and s.turns == 2 and s.gap == 4.0
    t.end(s.key, "a:1", 7.0)
    s, _ = t.begin(_ref(1), "a:1", 2000.0, now=9.0)
    assert s.gap == 3.0  # EWMA of 4 and 2
    assert t.program_gap(7) == 3.0
    fresh, _ = t.begin(_ref(2), "c:1", 10.0, now=9.5)
    assert t.expected_gap(fresh, prior=10.0) == 3.0  # the program's pause is the prior of a new session


# ---- the scheduler: stay, move, keep warm, forget ------------------------------------------------------------
def _loaded():
    return load_scheduler(None, rng=random.Random(0))


def _sched():
    return _loaded().fallback


def _turn(sched, r: LLMRequest, cands, now: float, inflight=None, end: float | None = None):
    c = ctx(r, cands, inflight=inflight, now=now)
    res = sched.schedule(c)
    sched.pre_request(c, res)
    if end is not None:
        c.now = end
        sched.response_complete(c, res)
    return res


def _agent(sid: str, turn: int, rid: str) -> LLMRequest:
    prompt = SYSTEM + "".join(f" turn {i} of {sid}: " + "tool output " * 60 for i in range(turn))
    r = req(prompt, rid=rid)
    r.session = SessionRef(hash(sid) & (2**127 - 1), "header:x-session-id", 5)
    return r


def test_a_session_stays_unless_its_endpoint_is_clearly_worse() -> None:
    sched = _sched()
    cands = [ep(i) for i in range(4)]
    first = _turn(sched, _agent("s", 1, "a"), cands, 0.0, end=1.0)
    home = first.primary.key
    # Other traffic lands on home meanwhile: a little busier, but not clearly worse -> the turn stays.
    busy = {home: InflightLoad(3, 3000)}
    second = _turn(sched, _agent("s", 2, "b"), cands, 5.0, inflight=busy, end=6.0)
    assert second.primary.key == home
    note = session_note(second.state)
    assert note is not None and note.turn == 2 and note.why == "stayed"
    # Now home is far behind (a long queue): the turn moves, and says why.
    jammed = {home: InflightLoad(60, 60_000)}
    third = _turn(sched, _agent("s", 3, "c"), cands, 10.0, inflight=jammed, end=11.0)
    assert third.primary.key != home
    note = session_note(third.state)
    assert note is not None and note.turn == 3 and note.why.startswith("moved:")


def test_requests_without_a_session_are_placed_as_before() -> None:
    with_plugin, plain = _sched(), _sched()
    plain_profile = plain.profiles["default"]
    plain_profile.scorers = plain_profile.scorers[:1]  # estimated-latency alone, the old default
    plain_profile.__post_init__()
    r = random.Random(4)
    cands = [ep(i, waiting=r.randrange(3), running=r.randrange(8)) for i in range(6)]
    for i in range(60):
        prompt = f"group {r.randrange(5)} " * 300 + str(i)
        a = _turn(with_plugin, req(prompt, rid=f"r{i}"), cands, i * 0.1, end=i * 0.1 + 0.05)
        b = _turn(plain, req(prompt, rid=f"r{i}"), cands, i * 0.1, end=i * 0.1 + 0.05)
        assert a.primary.key == b.primary.key, i


def test_context_is_kept_warm_until_the_session_goes_quiet() -> None:
    sched = _sched()
    session = sched.profiles["default"].scorers[1][0]
    latency = sched.profiles["default"].scorers[0][0]
    board = session.board
    assert latency._warm is board  # one board per loaded scheduler
    cands = [ep(i) for i in range(2)]
    res = _turn(sched, _agent("w", 1, "a"), cands, 0.0, end=2.0)
    home = res.primary.key
    protected = board.current(2.0)
    assert protected.get(home, 0) > 0  # the next turn is expected: its context counts as worth keeping
    assert board.until(session.table.get(res.state[SESSION].ref.key, 2.0).key) == 2.0 + 20.0  # 2 x the 10 s prior
    assert not board.current(22.5)  # quiet for longer than expected: released
    # The next turn releases it as it starts (the context is in use again).
    _turn(sched, _agent("w", 2, "b"), cands, 3.0)
    assert not board.current(3.0)


def test_protected_context_raises_the_eviction_price() -> None:
    shared: dict = {}
    latency = plugin("estimated-latency-scorer", shared=shared)
    plugin("agent-session-scorer", shared=shared)
    full = [ep(i, num_gpu_blocks=64, block_size=16) for i in range(2)]
    for e in full:  # both endpoints full: any new prompt evicts
        latency.prefix.index.set_capacity(e.key, 4)
        latency.prefix.index.record(e.key, [10_000 + i for i in range(4)], 0.0)
    c = ctx(req("a new prompt " * 300), full, now=1.0)
    before = list(latency.score(c, full, {}))
    assert before[0] == before[1]
    from scheduling.sessions.warm import warm_board

    warm_board(shared).protect(1, full[0].key, 5000.0, until=100.0)
    after = list(latency.score(c, full, {}))
    assert after[0] < after[1] == 1.0  # the new prompt goes where it evicts nothing about to be used


def test_a_session_whose_endpoint_leaves_mid_session() -> None:
    loaded = _loaded()
    sched = loaded.fallback
    session = sched.profiles["default"].scorers[1][0]
    cands = [ep(i) for i in range(3)]
    first = _turn(sched, _agent("x", 1, "a"), cands, 0.0)  # turn 1 still in flight when its endpoint leaves
    home = first.primary.key
    loaded.endpoint_removed(home)
    assert home not in session.tracked_endpoints()
    assert home not in session.board.current(0.5)
    left = [e for e in cands if e.key != home]
    second = _turn(sched, _agent("x", 2, "b"), left, 5.0, end=6.0)
    assert second.primary.key != home
    note = session_note(second.state)
    assert note is not None and note.turn == 2 and not note.parallel  # a new turn, not a call of the old one
    assert "endpoint left" in note.why
    third = _turn(sched, _agent("x", 3, "c"), left, 8.0, end=9.0)
    assert third.primary.key == second.primary.key and session_note(third.state).why == "stayed"


def test_fan_out_is_co_located_while_it_fits_then_spreads() -> None:
    sched = _sched()
    cands = [ep(i) for i in range(4)]
    home = _turn(sched, _agent("f", 1, "a"), cands, 0.0, end=1.0).primary.key
    load: dict[str, InflightLoad] = {}
    placed = []
    for b in range(12):  # twelve parallel calls of turn 2, each counted in flight where it went
        res = _turn(sched, _agent("f", 2, f"p{b}"), cands, 5.0, inflight=dict(load))
        k = res.primary.key
        placed.append(k)
        load[k] = InflightLoad(load.get(k, InflightLoad()).requests + 1, 0)
    assert placed[:2] == [home, home]  # co-located while it fits
    assert len(set(placed)) > 1  # spread when it does not
    notes = [placed.count(home)]
    assert notes[0] < 12


def test_sessions_replicate_between_processes() -> None:
    a, b = _sched(), _sched()
    sa, sb = a.profiles["default"].scorers[1][0], b.profiles["default"].scorers[1][0]
    sa.set_replicating(True)
    cands = [ep(i) for i in range(4)]
    home = _turn(a, _agent("r", 1, "a"), cands, 0.0, end=1.0).primary.key
    records = sa.export_records(1.5)
    assert len(records) == 2  # the binding at the turn's start, the protection at its end
    assert sb.apply_records("peer-a", records, 100.0) == 0
    ref = _agent("r", 2, "b").session
    s = sb.table.get(ref.key, 100.0)
    assert s is not None and s.endpoint == home and s.turns == 1
    assert sb.board.current(100.0).get(home, 0) > 0  # the protection travels too
    # The next turn decided by replica b stays on the context replica a placed.
    busy = {home: InflightLoad(2, 0)}
    assert _turn(b, _agent("r", 2, "b"), cands, 101.0, inflight=busy).primary.key == home
    # Malformed records are counted and skipped.
    assert sb.apply_records("peer-a", [["x"], [home, b"short", 0, 1, -1, 0, 0, -1],
                                       [home, bytes(16), -5, 1, -1, 0, 0, -1]], 100.0) == 3
    assert len(sb.snapshot_records(100.0)) == 1


def _program_sched(factor: float = 1.25, share: bool = True):
    doc = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
           "plugins": [{"type": "estimated-latency-scorer"},
                       {"type": "agent-session-scorer",
                        "parameters": {"programFactor": factor, "programShare": share}},
                       {"type": "max-score-picker"}],
           "schedulingProfiles": [{"name": "default", "plugins": [
               {"pluginRef": "estimated-latency-scorer"}, {"pluginRef": "agent-session-scorer"},
               {"pluginRef": "max-score-picker"}]}]}
    return load_scheduler([doc], rng=random.Random(0)).fallback


def test_new_sessions_join_their_program_when_asked() -> None:
    sched = _program_sched(share=False)  # one program gathers on one endpoint (programShare off)
    cands = [ep(i) for i in range(4)]
    home = _turn(sched, _agent("p1", 1, "a"), cands, 0.0, end=1.0).primary.key
    busy = {home: InflightLoad(1, 0)}  # a little busier than the others: predicted latency alone would go elsewhere
    assert _turn(_program_sched(1.0), _agent("p2", 1, "b"), cands, 2.0, inflight=busy).primary.key != home
    # With programShare (the default) a lone program holds every endpoint's worth: it gathers nowhere, its new
    # sessions go where predicted latency alone sends them.
    shared, plain = _program_sched(), _program_sched(1.0)
    for s in (shared, plain):
        assert _turn(s, _agent("p1", 1, "a"), cands, 0.0, end=1.0).primary.key == home
    jammed = {home: InflightLoad(6, 0)}
    res = _turn(shared, _agent("p2", 1, "b"), cands, 2.0, inflight=jammed)
    assert res.primary.key == _turn(plain, _agent("p2", 1, "b"), cands, 2.0, inflight=jammed).primary.key != home
    assert session_note(res.state).why == "new session"
    res = _turn(sched, _agent("p2", 1, "b"), cands, 2.0, inflight=busy)
    assert res.primary.key == home
    assert session_note(res.state).why == f"new session: joined its program on {home}"
    jammed = {home: InflightLoad(40, 0)}  # the home is full: the next new session spreads
    res = _turn(sched, _agent("p3", 1, "c"), cands, 3.0, inflight=jammed)
    assert res.primary.key != home and "predicted clearly slower" in session_note(res.state).why


def _program_session(sid: str, program: int, rid: str) -> LLMRequest:
    r = req(f"agent {program} tools " * 300 + f"task of {sid}", rid=rid)
    r.session = SessionRef(hash(sid) & (2**127 - 1), "user", program)
    return r


def test_programs_spread_over_the_endpoints_and_their_sessions_follow() -> None:
    sched = _program_sched()
    cands = [ep(i) for i in range(4)]
    homes = {}
    for p in range(4):  # each program's first session starts where no other program lives
        homes[p] = _turn(sched, _program_session(f"first-{p}", p + 1, f"f{p}"), cands, p * 0.1, end=p * 0.1 + 1).primary.key
    assert len(set(homes.values())) == 4
    load: dict[str, InflightLoad] = {}
    for i in range(12):  # later sessions join their program's home while it is not clearly slower
        p = i % 4
        res = _turn(sched, _program_session(f"s{i}", p + 1, f"r{i}"), cands, 5 + i * 0.1, inflight=dict(load))
        assert res.primary.key == homes[p], i
        load[res.primary.key] = InflightLoad(load.get(res.primary.key, InflightLoad()).requests + 1, 0)
    assert "joined its program" in session_note(res.state).why


def test_one_program_is_placed_as_without_program_affinity() -> None:
    """A chat app whose users send `user` is one program: the default (programFactor 3, programShare) places its
    new sessions exactly as predicted latency alone does (programFactor 1)."""
    gathering, plain = _sched(), _program_sched(1.0)
    assert gathering.profiles["default"].scorers[1][0].params.programFactor == 3.0
    r = random.Random(7)
    cands = [ep(i) for i in range(4)]
    load: dict[str, InflightLoad] = {}
    for i in range(40):
        inflight = {k: InflightLoad(v.requests + r.randrange(2), 0) for k, v in load.items()}
        a = _turn(gathering, _program_session(f"u{i}", 9, f"r{i}"), cands, i * 0.5, inflight=inflight)
        b = _turn(plain, _program_session(f"u{i}", 9, f"r{i}"), cands, i * 0.5, inflight=inflight)
        assert a.primary.key == b.primary.key, i
        k = a.primary.key
        load[k] = InflightLoad(load.get(k, InflightLoad()).requests + 1, 0)
    assert len(load) > 1  # the users spread over the pool


def test_two_programs_gather_on_their_share_of_the_endpoints() -> None:
    sched = _program_sched(3.0)
    cands = [ep(i) for i in range(4)]
    table = sched.profiles["default"].scorers[1][0].table
    placed: dict[int, set[str]] = {1: set(), 2: set()}
    load: dict[str, InflightLoad] = {}
    for i in range(40):
        p = 1 + i % 2
        res = _turn(sched, _program_session(f"s{i}", p, f"r{i}"), cands, i * 0.1, inflight=dict(load))
        k = res.primary.key
        load[k] = InflightLoad(load.get(k, InflightLoad()).requests + 1, 0)
        if i >= 20:
            placed[p].add(k)
    assert abs(table.program_share(1) - 0.5) < 1e-9 and table.bound_total == 40
    # Each program holds half the sessions: once settled, its new sessions go to its two endpoints only.
    assert len(placed[1]) <= 2 and len(placed[2]) <= 2 and len(placed[1] | placed[2]) >= 3


def _evict_sched(on: bool):
    doc = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
           "plugins": [{"type": "estimated-latency-scorer"},
                       {"type": "agent-session-scorer", "parameters": {"moveFactor": 3.0, "moveWhenEvicted": on}},
                       {"type": "max-score-picker"}],
           "schedulingProfiles": [{"name": "default", "plugins": [
               {"pluginRef": "estimated-latency-scorer"}, {"pluginRef": "agent-session-scorer"},
               {"pluginRef": "max-score-picker"}]}]}
    return load_scheduler([doc], rng=random.Random(0)).fallback


def test_a_turn_whose_context_is_predicted_evicted_is_placed_on_latency_when_asked() -> None:
    cands = [ep(i) for i in range(4)]
    for on in (False, True):
        sched = _evict_sched(on)
        latency = sched.profiles["default"].scorers[0][0]
        home = _turn(sched, _agent("e", 1, "a"), cands, 0.0, end=1.0).primary.key
        busy = {home: InflightLoad(4, 4000)}
        assert _turn(sched, _agent("e", 2, "b"), cands, 5.0, inflight=busy, end=6.0).primary.key == home
        latency.prefix.index.set_capacity(home, 1)  # other traffic evicted the session's context there
        res = _turn(sched, _agent("e", 3, "c"), cands, 10.0, inflight=busy)
        note = session_note(res.state)
        if on:
            assert res.primary.key != home and note.why == f"moved: its context is predicted evicted from {home}"
        else:
            assert res.primary.key == home and note.why == "stayed"


def test_a_program_over_its_endpoints_spills_where_the_fewest_sessions_live() -> None:
    doc = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
           "plugins": [{"type": "estimated-latency-scorer"},
                       {"type": "agent-session-scorer", "parameters": {"programSpill": 1.2}},
                       {"type": "max-score-picker"}],
           "schedulingProfiles": [{"name": "default", "plugins": [
               {"pluginRef": "estimated-latency-scorer"}, {"pluginRef": "agent-session-scorer"},
               {"pluginRef": "max-score-picker"}]}]}
    sched = load_scheduler([doc], rng=random.Random(0)).fallback
    table = sched.profiles["default"].scorers[1][0].table
    cands = [ep(i) for i in range(2)]
    first = {p: _turn(sched, _program_session(f"first-{p}", p, f"f{p}"), cands, p * 0.1, end=p * 0.1 + 1).primary.key
             for p in (1, 2)}
    assert first[1] != first[2]
    notes = []
    for i in range(12):  # program 1 has three sessions to every one of program 2's
        p = 2 if i % 4 == 3 else 1
        res = _turn(sched, _program_session(f"s{i}", p, f"r{i}"), cands, 5 + i * 0.1, end=5.05 + i * 0.1)
        notes.append(session_note(res.state).why)
    # Without spilling program 1 would hold 10 of 14 sessions on one endpoint; it holds at most 1.2x the mean + 1.
    assert max(table.bound_at.values()) <= 1.2 * 7 + 1
    assert any("is over its share, placed where the fewest sessions live" in w for w in notes)
