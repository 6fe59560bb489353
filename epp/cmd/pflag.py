"""Go pflag's command-line syntax, read the way GIE's and llm-d's EPP binaries read it (spf13/pflag v1.0.10).

Charts and operators written for those binaries pass arguments argparse would refuse or read differently; this module
turns such a command line into one argparse reads with the same meaning:

- `--name value` and `--name=value`; a value is taken as is, even when it starts with a dash or is empty
  (`--lora-info-metric ""`).
- booleans: `--b` is true, `--b=false` / `--b=0` / `--b=F` set it (Go's strconv.ParseBool spellings);
  `--b false` sets it TRUE and leaves "false" as a stray positional argument, which the EPP ignores (GIE's v1.5
  chart renders its `flags:` map that way: `--enable-pprof` `"false"` leaves pprof on).
- the one shorthand, `-v`: `-v 4`, `-v=4`, `-v4` (and `--v=4`).
- a repeated flag: the last one wins; a slice flag (`--endpoint-target-ports`) takes comma lists and a repeat
  appends to it.
- one pair of quotes around a value is removed (`--cache-info-metric="sglang:cache_config_info"`, rendered by a
  chart as one argument, reaches the binary with the quotes inside).
- `--` ends the flags; everything after it is positional.

An unknown flag is an error naming it (the binary's exit 2). This module imports nothing but the standard library:
the caller says which flags exist and of what kind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

BOOL = "bool"  # --b, --b=v (v a Go bool); never takes the next argument
VALUE = "value"  # --k v, --k=v
SLICE = "slice"  # a VALUE whose repeats append (comma lists)
SWITCH = "switch"  # an argparse store_true flag: emitted bare, and dropped when set false
REPEAT = "repeat"  # an argparse append flag: every occurrence is kept
KINDS = (BOOL, VALUE, SLICE, SWITCH, REPEAT)

GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
GO_FALSE = ("0", "f", "F", "FALSE", "false", "False")
HELP = ("-h", "--help")


class FlagError(ValueError):
    """A command line pflag would refuse (the binary exits 2); the message names the flag."""


def go_bool(flag: str, text: str) -> bool:
    """Go's strconv.ParseBool, as pflag applies it to `--flag=text` (and Pointsman's own yes/no, on/off)."""
    if text in GO_TRUE or text.lower() in ("yes", "on"):
        return True
    if text in GO_FALSE or text.lower() in ("no", "off"):
        return False
    raise FlagError(f'invalid argument "{text}" for "--{flag}" flag: expected true or false')


def unquote(value: str) -> str:
    """`"x"` or `'x'` -> `x` (one pair, only when both ends match); anything else as is."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


@dataclass(frozen=True)
class Occurrence:
    name: str  # the long name, without dashes
    value: str  # canonical: "true"/"false" for booleans


@dataclass(frozen=True)
class Parsed:
    """A command line read as pflag reads it."""

    occurrences: tuple[Occurrence, ...]  # every flag set, in order
    positionals: tuple[str, ...]  # the stray arguments (the EPP ignores them)
    help: bool = False
    kinds: Mapping[str, str] | None = None

    def values(self) -> dict[str, str]:
        """name -> the value it ends with: the last one given; a slice's values joined with commas."""
        out: dict[str, str] = {}
        for o in self.occurrences:
            if self.kind(o.name) == SLICE and o.name in out:
                out[o.name] = ",".join(v for v in (out[o.name], o.value) if v)
            else:
                out[o.name] = o.value
        return out

    def kind(self, name: str) -> str:
        return (self.kinds or {}).get(name, VALUE)

    def argv(self) -> list[str]:
        """The command line for argparse: `--name=value` per occurrence (a slice once, joined), in order."""
        final = self.values()
        out: list[str] = ["--help"] if self.help else []
        emitted: set[str] = set()
        for o in self.occurrences:
            kind = self.kind(o.name)
            if kind == SLICE:
                if o.name not in emitted:
                    emitted.add(o.name)
                    out.append(f"--{o.name}={final[o.name]}")
            elif kind == SWITCH:
                if o.value == "true":
                    out.append(f"--{o.name}")
            else:
                out.append(f"--{o.name}={o.value}")
        return out


def parse(argv: Iterable[str], kinds: Mapping[str, str], shorthands: Mapping[str, str] | None = None,
          aliases: Mapping[str, str] | None = None) -> Parsed:
    """Read `argv` as pflag would, given every flag's kind (`kinds`: long name -> one of KINDS), the shorthands
    (`v` -> `v` for `-v`) and other spellings of long names (`poolName` -> `pool-name`). FlagError names an
    unknown flag, a missing value or a bad boolean."""
    short = dict(shorthands or {})
    alias = dict(aliases or {})
    args = list(argv)
    found: list[Occurrence] = []
    stray: list[str] = []
    want_help = False
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if a == "--":
            stray += args[i:]
            break
        if a in HELP:
            want_help = True
            continue
        if not a.startswith("-") or a == "-":
            stray.append(a)
            continue
        if a.startswith("--"):
            name, eq, inline = a[2:].partition("=")
            if not name or name.startswith("-"):
                raise FlagError(f"bad flag syntax: {a}")
        else:  # shorthand: -v 4, -v=4, -v4
            letter, rest = a[1], a[2:]
            if letter not in short:
                raise FlagError(f"unknown shorthand flag: {letter!r} in {a}")
            name = short[letter]
            eq, inline = ("=", rest[1:]) if rest.startswith("=") else ("=", rest) if rest else ("", "")
        name = alias.get(name, name)
        kind = kinds.get(name)
        if kind is None:
            raise FlagError(f"unknown flag: --{name}")
        if kind in (BOOL, SWITCH):
            value = "true" if not eq else "true" if go_bool(name, unquote(inline)) else "false"
        elif eq:
            value = unquote(inline)
        elif i < len(args):
            value, i = unquote(args[i]), i + 1
        else:
            raise FlagError(f"flag needs an argument: --{name}")
        found.append(Occurrence(name, value))
    return Parsed(tuple(found), tuple(stray), want_help, dict(kinds))


__all__ = ["BOOL", "GO_FALSE", "GO_TRUE", "KINDS", "REPEAT", "SLICE", "SWITCH", "VALUE", "FlagError", "Occurrence",
           "Parsed", "go_bool", "parse", "unquote"]
