"""The pflag reader (epp/cmd/pflag.py) against pflag's rules: `--k v` = `--k=v`, booleans never take the next
argument, `-v N` / `-v=N` / `-vN` / `--v=N`, the last of a repeated flag wins, slices append, one pair of quotes
around a value goes, unknown flags are errors naming them. Properties over generated command lines, then the
cases charts render."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epp.cmd.pflag import BOOL, GO_FALSE, GO_TRUE, SLICE, SWITCH, VALUE, FlagError, parse

KINDS = {"name": VALUE, "port": VALUE, "v": VALUE, "on": BOOL, "off": BOOL, "ports": SLICE, "sw": SWITCH}
SHORT = {"v": "v"}

values = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
plain = values.filter(lambda v: not (len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'"))  # no surrounding quotes
bools = st.sampled_from(GO_TRUE + GO_FALSE)


@st.composite
def occurrence(draw: st.DrawFn) -> tuple[list[str], str, str]:
    """(argv pieces, flag name, the value pflag gives it) for one flag, in any of its spellings."""
    name = draw(st.sampled_from(sorted(KINDS)))
    kind = KINDS[name]
    if kind in (BOOL, SWITCH):
        form = draw(st.sampled_from(["bare", "eq"]))
        if form == "bare":
            return [f"--{name}"], name, "true"
        b = draw(bools)
        return [f"--{name}={b}"], name, "true" if b in GO_TRUE else "false"
    v = draw(plain.filter(lambda x: "," not in x) if kind == SLICE else plain)
    forms = ["space", "eq"] + (["short-space", "short-eq", "short-glued"] if name == "v" and v else [])
    form = draw(st.sampled_from(forms))
    pieces = {"space": [f"--{name}", v], "eq": [f"--{name}={v}"], "short-space": ["-v", v],
              "short-eq": [f"-v={v}"], "short-glued": [f"-v{v}"]}[form]
    if form == "short-glued" and v.startswith("="):
        pieces = [f"-v={v}"]
    return pieces, name, v


@given(st.lists(occurrence(), max_size=12))
def test_every_spelling_reads_as_its_value_and_the_last_one_wins(occs):
    argv = [a for pieces, _, _ in occs for a in pieces]
    parsed = parse(argv, KINDS, SHORT)
    assert parsed.positionals == ()
    assert [(o.name, o.value) for o in parsed.occurrences] == [(n, v) for _, n, v in occs]
    expected: dict[str, str] = {}
    for _, n, v in occs:
        if KINDS[n] == SLICE and n in expected:
            expected[n] = ",".join(x for x in (expected[n], v) if x)
        else:
            expected[n] = v
    assert parsed.values() == expected
    # What argparse is handed reads back the same (the normal form is a fixed point).
    again = parse(parsed.argv(), KINDS, SHORT)
    assert again.values() == {k: v for k, v in expected.items() if not (KINDS[k] == SWITCH and v == "false")}


@given(st.sampled_from(["on", "off"]), bools)
def test_a_boolean_never_takes_the_next_argument(flag, stray):
    parsed = parse([f"--{flag}", stray, "--name", "x"], KINDS, SHORT)
    assert parsed.values() == {flag: "true", "name": "x"}  # `--b false` is --b=true and a stray "false"
    assert parsed.positionals == (stray,)


@given(plain)
def test_one_pair_of_quotes_around_a_value_goes(v):
    for q in ('"', "'"):
        assert parse([f"--name={q}{v}{q}"], KINDS).values() == {"name": v}
        assert parse(["--name", f"{q}{v}{q}"], KINDS).values() == {"name": v}
    assert parse(['--name="a\'', "--port", '"'], KINDS).values() == {"name": "\"a'", "port": '"'}  # unmatched


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=10).filter(
    lambda n: n not in KINDS and not n.startswith("-")))
def test_an_unknown_flag_is_an_error_naming_it(name):
    with pytest.raises(FlagError, match=f"--{name}"):
        parse(["--name", "x", f"--{name}", "1"], KINDS)


def test_values_that_look_like_flags_or_are_empty_are_taken():
    assert parse(["--name", "--port", "--port", ""], KINDS).values() == {"name": "--port", "port": ""}
    assert parse(["--v", "-1"], KINDS, SHORT).values() == {"v": "-1"}


def test_errors_name_the_flag():
    with pytest.raises(FlagError, match="flag needs an argument: --name"):
        parse(["--name"], KINDS)
    with pytest.raises(FlagError, match='invalid argument "maybe" for "--on"'):
        parse(["--on=maybe"], KINDS)
    with pytest.raises(FlagError, match="unknown shorthand flag: 'x'"):
        parse(["-x"], KINDS, SHORT)
    with pytest.raises(FlagError, match="bad flag syntax"):
        parse(["---name"], KINDS)


def test_double_dash_ends_the_flags_and_help_is_kept():
    parsed = parse(["--name", "a", "--help", "--", "--port", "1"], KINDS)
    assert parsed.values() == {"name": "a"} and parsed.positionals == ("--port", "1") and parsed.help
    assert parsed.argv()[0] == "--help"


def test_aliases_are_other_spellings_of_a_flag():
    parsed = parse(["--poolName", "p", "--pool-name=q"], {"pool-name": VALUE}, aliases={"poolName": "pool-name"})
    assert parsed.values() == {"pool-name": "q"}


@given(bools)
def test_pointsmans_own_booleans_also_take_a_separate_value(b):
    from epp.cmd.pflag import OPTBOOL

    parsed = parse(["--eds", b, "--name", "x"], {**KINDS, "eds": OPTBOOL})
    assert parsed.values() == {"eds": "true" if b in GO_TRUE else "false", "name": "x"} and parsed.positionals == ()
    assert parse(["--eds", "x"], {**KINDS, "eds": OPTBOOL}).positionals == ("x",)
