"""Field readers for route documents: every error names the document, the field and what was expected."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TypeVar, overload

from epp.routing.model import RouteConfigError

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # an RFC 9110 token
Choice = TypeVar("Choice", bound=str)  # an enum field's values (a Literal type when the model declares one)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def document_name(obj: object, where: str) -> str:
    """How errors name a document: `Kind namespace/name (where)`."""
    kind = obj.get("kind", "document") if isinstance(obj, Mapping) else "document"
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    name = meta.get("name") or "<unnamed>"
    return f"{kind} {meta.get('namespace') or 'default'}/{name} ({where})"


def identity(obj: Mapping[str, object]) -> tuple[str, str, str] | None:
    """(kind, namespace, name) of a Kubernetes-style document when it says that much, else None."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta.get("name"):
        return None
    return str(obj.get("kind") or ""), str(meta.get("namespace") or "default"), str(meta["name"])


class Doc:
    """One document being read; `name` is how errors call it, e.g. "ModelRoute default/r (routes.yaml, document 2)"."""

    def __init__(self, name: str) -> None:
        self.name = name

    def object_ref(self, meta: Mapping[str, object]) -> tuple[str, str]:
        """(namespace, name) of a document's `metadata`; the namespace defaults to `default`."""
        name = self.string(meta.get("name"), "metadata.name", required=True, max_len=253, pattern=DNS_SUBDOMAIN,
                           what="a DNS-1123 name")
        namespace = self.string(meta.get("namespace"), "metadata.namespace", max_len=63, pattern=DNS_SUBDOMAIN,
                                what="a namespace name") or "default"
        assert name is not None
        return namespace, name

    def fail(self, path: str, expected: str) -> RouteConfigError:
        return RouteConfigError(self.name, path, expected)

    def mapping(self, value: object, path: str, known: Iterable[str] | None = None, *, required: bool = False
                ) -> Mapping[str, object]:
        """A mapping (an absent optional one reads as {}); with `known`, an unknown field is an error."""
        if value is None:
            if required:
                raise self.fail(path, "a mapping (it is required)")
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(path, f"a mapping, got {_show(value)}")
        if known is not None:
            allowed = set(known)
            unknown = sorted(str(k) for k in value if k not in allowed)
            if unknown:
                raise self.fail(_join(path, unknown[0]), f"one of the fields {', '.join(sorted(allowed))} "
                                                         f"(unknown field {unknown[0]!r})")
        return value

    def list(self, value: object, path: str, *, max_items: int | None = None, min_items: int = 0) -> list[object]:
        if value is None:
            value = []
        if not isinstance(value, list):
            raise self.fail(path, f"a list, got {_show(value)}")
        if len(value) < min_items:
            raise self.fail(path, f"at least {min_items} item(s), got {len(value)}")
        if max_items is not None and len(value) > max_items:
            raise self.fail(path, f"at most {max_items} items, got {len(value)}")
        return value

    def string(self, value: object, path: str, *, required: bool = False, max_len: int | None = None,
               pattern: re.Pattern[str] | None = None, what: str = "a string") -> str | None:
        if value is None or (value == "" and not required):
            if required:
                raise self.fail(path, f"{what} (it is required)")
            return None
        if not isinstance(value, str) or (required and not value):
            raise self.fail(path, f"{what}, got {_show(value)}")
        if max_len is not None and len(value) > max_len:
            raise self.fail(path, f"{what} of at most {max_len} characters, got {len(value)}")
        if pattern is not None and not pattern.match(value):
            raise self.fail(path, f"{what} matching {pattern.pattern}, got {_show(value)}")
        return value

    def integer(self, value: object, path: str, *, lo: int | None = None, hi: int | None = None,
                default: int | None = None) -> int | None:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"an integer, got {_show(value)}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            rng = f"{lo if lo is not None else '-inf'}..{hi if hi is not None else 'inf'}"
            raise self.fail(path, f"an integer in {rng}, got {value}")
        return value

    def boolean(self, value: object, path: str, default: bool = False) -> bool:
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(path, f"true or false, got {_show(value)}")
        return value

    @overload
    def enum(self, value: object, path: str, choices: Iterable[Choice], default: Choice) -> Choice: ...
    @overload
    def enum(self, value: object, path: str, choices: Iterable[Choice], default: None = None) -> Choice | None: ...

    def enum(self, value: object, path: str, choices: Iterable[Choice], default: Choice | None = None
             ) -> Choice | None:
        """One of `choices` (the choice itself, so a Literal type stays one); absent or empty reads as `default`."""
        options = list(choices)
        if value is None or value == "":
            return default
        for option in options:
            if value == option:
                return option
        raise self.fail(path, f"one of {', '.join(options)}, got {_show(value)}")

    def labels(self, value: object, path: str, *, non_empty: bool = False) -> dict[str, str]:
        m = self.mapping(value, path)
        if non_empty and not m:
            raise self.fail(path, "a non-empty map of label -> value")
        out: dict[str, str] = {}
        for k, v in m.items():
            if not isinstance(k, str) or not k or not isinstance(v, (str, int, float, bool)) or isinstance(v, bool):
                raise self.fail(_join(path, str(k)), f"a label key -> string value, got {_show(v)}")
            out[k] = str(v)
        return out


join = _join
