"""How typed headers convert: extFields (string -> string) in, dataclasses out (the header
classes themselves are the catalogue in ``headers.py``).

RocketMQ flattens each "custom header" object into extFields by field name and converts the
strings back by declared type (docs/protocol.md §2.5).  Here every header is a dataclass whose fields
declare their wire name, type, whether they are required and their valid range; one generic
``from_ext``/``to_ext`` pair does the conversion, so processors receive typed, validated values
and never parse strings themselves.  ``from_ext`` and ``to_ext`` run a decoder and an encoder
generated once per class (and key map) from the field declarations, straight-line code with the
wire keys as constants, because every request the broker reads and the SDK sends goes through one.

Field checks live here (presence, type, range, allowed values); checks against broker state
(does the topic exist, is the queue id below the topic's queue count, permissions) stay in the
processors.

Conversions follow Java's rules with the leniency real clients need:

* integers are int32 (``Integer``) or int64 (``Long``), range-checked;
* booleans are ``true``/``false`` or ``1``/``0`` in any case, because the C++ client sends
  ``"0"``/``"1"`` where Java's ``Boolean.parseBoolean`` would read ``"1"`` as false
  (docs/protocol.md §8.2: a Java broker silently ignores C++ batches); any other text is an
  ill-typed field and refused, like a non-numeric integer;
* a required field that is missing, empty or ill-typed raises :class:`HeaderError` carrying the
  response code to answer with and a remark that names the field.

Response headers and broker-to-client requests are encoded with ``to_ext``, which writes
strings only: the C++ client ignores values that are JSON numbers (docs/protocol.md §8.3).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Self, TypeVar

from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.errors import Refusal

INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)


class HeaderError(Refusal):
    """A header or body the broker refuses: answer with ``code`` and ``remark``.

    This is the peer's mistake, not ours: a :class:`Refusal`, so the server turns it into an
    error response and keeps the connection.
    """


# --- field declarations ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Spec:
    """How one dataclass field maps to one extFields entry."""

    attr: str
    wire: str
    kind: str  # "str" | "int" | "long" | "bool"
    required: bool
    lo: int | None
    hi: int | None
    choices: tuple[str, ...] | None
    allow_empty: bool


def _field(wire: str, kind: str, default: Any, *, lo: int | None = None, hi: int | None = None,
           choices: tuple[str, ...] | None = None, allow_empty: bool = False) -> Any:
    meta = {"wire": wire, "kind": kind, "lo": lo, "hi": hi, "choices": choices,
            "allow_empty": allow_empty}
    if default is MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def h_str(wire: str, default: Any = MISSING, *, choices: tuple[str, ...] | None = None,
          allow_empty: bool = False) -> Any:
    """A String field; required (and non-empty unless ``allow_empty``) without a default."""
    return _field(wire, "str", default, choices=choices, allow_empty=allow_empty)


def h_int(wire: str, default: Any = MISSING, *, lo: int | None = None, hi: int | None = None) -> Any:
    """An Integer (int32) field."""
    return _field(wire, "int", default, lo=lo, hi=hi)


def h_long(wire: str, default: Any = MISSING, *, lo: int | None = None, hi: int | None = None) -> Any:
    """A Long (int64) field."""
    return _field(wire, "long", default, lo=lo, hi=hi)


def h_bool(wire: str, default: Any = MISSING) -> Any:
    """A boolean field: true/1 (any case) is true, anything else false."""
    return _field(wire, "bool", default)


_SPECS: dict[type, tuple[_Spec, ...]] = {}
_BOUNDS = {"int": INT32, "long": INT64}

#: Accepted boolean spellings (after strip/lower): Java writes true/false, the C++ client 1/0.
_BOOLS = {"true": True, "false": False, "1": True, "0": False}

H = TypeVar("H", bound="Header")

#: One step of a compiled decoder: (attribute, wire key, fallback key or None, converter or
#: None for a plain string, required, allow_empty, the field's name as remarks spell it).
_Step = tuple[str, str, str | None, Callable[[str], Any] | None, bool, bool, str]


class Header:
    """Base of all typed headers; subclasses are keyword-only dataclasses using ``h_*`` fields."""

    __slots__ = ()

    #: Response code for a refused header of this kind.
    ERROR_CODE: ClassVar[int] = ResponseCode.SYSTEM_ERROR

    @classmethod
    def _specs(cls) -> tuple[_Spec, ...]:
        specs = _SPECS.get(cls)
        if specs is None:
            specs = tuple(
                _Spec(f.name, f.metadata["wire"], f.metadata["kind"],
                      f.default is MISSING and f.default_factory is MISSING,
                      f.metadata["lo"], f.metadata["hi"], f.metadata["choices"],
                      f.metadata["allow_empty"])
                for f in fields(cls)  # type: ignore[arg-type]
                if "wire" in f.metadata
            )
            _SPECS[cls] = specs
        return specs

    @classmethod
    def _plan(cls, keys: Mapping[str, str] | None = None) -> tuple[_Step, ...]:
        """The decoding steps of this class, one per field.

        ``keys`` renames wire keys (SEND_MESSAGE_V2's one-letter keys); the long name stays
        readable as a fallback and remarks name both, e.g. ``'b' (topic)``.
        """
        steps = []
        for spec in cls._specs():
            short = keys.get(spec.wire) if keys else None
            wire, fallback = (short, spec.wire) if short else (spec.wire, None)
            name = f"'{short}' ({spec.wire})" if short else f"'{spec.wire}'"
            steps.append((spec.attr, wire, fallback, _converter(cls, spec, name),
                          spec.required, spec.allow_empty, name))
        return tuple(steps)

    @classmethod
    def from_ext(cls, ext: Mapping[str, str]) -> Self:
        """Decode and validate; raises :class:`HeaderError` naming the offending field."""
        decode = _DECODERS.get((cls, None))
        if decode is None:
            decode = _compile_decoder(cls, None)
        return decode(ext)

    @classmethod
    def _decode_keyed(cls, ext: Mapping[str, str], keys: Mapping[str, str]) -> Self:
        """:meth:`from_ext` for a header whose wire keys ``keys`` renames."""
        decode = _DECODERS.get((cls, id(keys)))
        if decode is None:
            decode = _compile_decoder(cls, keys)
        return decode(ext)

    def to_ext(self) -> dict[str, str]:
        """extFields for the wire: strings only, absent (None) fields left out."""
        encode = _ENCODERS.get((self.__class__, None))
        if encode is None:
            encode = _compile_encoder(self.__class__, None)
        return encode(self)

    def _encode_keyed(self, keys: Mapping[str, str]) -> dict[str, str]:
        """:meth:`to_ext` with the wire keys renamed by ``keys`` (long name -> short)."""
        encode = _ENCODERS.get((self.__class__, id(keys)))
        if encode is None:
            encode = _compile_encoder(self.__class__, keys)
        return encode(self)


# --- compiled codecs ---------------------------------------------------------------------------
# Every request the broker reads and every one the SDK sends goes through a header's decoder
# or encoder, so each class gets both generated once from its field declarations (as
# dataclasses generates __init__): straight-line code with the wire keys as constants, no loop
# over field specs and no per-field branching on the kind at run time.

#: (header class, id of its key map or None) -> compiled decoder / encoder.
_DECODERS: dict[tuple[type, int | None], Callable[[Mapping[str, str]], Any]] = {}
_ENCODERS: dict[tuple[type, int | None], Callable[[Any], dict[str, str]]] = {}


def _absent(cls: type[Header], raw: str | None, name: str) -> None:
    """A required field is missing or empty: the refusal that says which."""
    if raw is None:
        raise HeaderError(cls.ERROR_CODE, f"missing header field {name}")
    raise HeaderError(cls.ERROR_CODE, f"header field {name} is empty")


def _compile_decoder(cls: type[Header], keys: Mapping[str, str] | None) -> Callable[[Mapping[str, str]], Any]:
    """The decoder of ``cls`` (and ``keys``), made once: the compiled twin's when it is in use
    (see the end of this module), else the generated Python code of :func:`python_decoder`."""
    decode = python_decoder(cls, keys) if _CompiledDecoder is None else compiled_decoder(cls, keys)
    _DECODERS[(cls, None if keys is None else id(keys))] = decode
    return decode


def compiled_decoder(cls: type[Header], keys: Mapping[str, str] | None) -> Callable[[Mapping[str, str]], Any]:
    """:func:`python_decoder`'s steps run by ``_header_codec.Decoder`` (the compiled twin):
    the same values and, through the same ``_absent`` and converters, the same refusals."""
    assert _CompiledDecoder is not None, "the compiled header codec is not in use"
    defaults = {f.name: f.default for f in fields(cls)}  # type: ignore[arg-type]
    specs = {spec.attr: spec for spec in cls._specs()}
    steps = []
    for attr, wire, fallback, convert, required, allow_empty, name in cls._plan(keys):
        spec = specs[attr]
        lo, hi = _bounds(spec) if spec.kind in _BOUNDS else (None, None)
        steps.append((attr, wire, fallback, convert, spec.kind, required, allow_empty, name,
                      defaults[attr], lo, hi))
    return _CompiledDecoder(cls, _absent, _BOOLS, steps)


def python_decoder(cls: type[Header], keys: Mapping[str, str] | None) -> Callable[[Mapping[str, str]], Any]:
    """``ext -> header``: each field read, checked and converted as :func:`_converter` says
    (integers and booleans inline, the converter only to word a refusal); an absent or empty
    optional field takes its declared default.  The reference the compiled twin follows."""
    env: dict[str, Any] = {"cls": cls, "_absent": _absent, "_BOOLS": _BOOLS}
    defaults = {f.name: f.default for f in fields(cls)}  # type: ignore[arg-type]
    lines = ["def decode(ext):", "    get = ext.get"]
    args = []
    for i, (attr, wire, fallback, convert, required, allow_empty, name) in enumerate(cls._plan(keys)):
        spec = next(s for s in cls._specs() if s.attr == attr)
        env[f"conv{i}"], env[f"name{i}"], env[f"d{i}"] = convert, name, defaults[attr]
        var = f"v{i}"
        args.append(f"{attr}={var}")
        lines.append(f"    raw = get({wire!r})")
        if fallback is not None:
            lines.append(f"    if raw is None: raw = get({fallback!r})")
        lines.append(f"    if {'raw is None' if allow_empty else 'raw is None or raw == empty'}:")
        lines.append(f"        {'_absent(cls, raw, name' + str(i) + ')' if required else var + ' = d' + str(i)}")
        if convert is None:
            lines.append(f"    else: {var} = raw")
        elif spec.kind in ("int", "long"):
            lo, hi = _bounds(spec)
            lines += ["    else:",
                      f"        {var} = int(raw) if raw.isdecimal() else conv{i}(raw)",
                      f"        if not {lo} <= {var} <= {hi}: conv{i}(raw)"]
        elif spec.kind == "bool":
            lines += ["    else:",
                      f"        {var} = _BOOLS.get(raw)",
                      f"        if {var} is None: {var} = conv{i}(raw)"]
        else:
            lines.append(f"    else: {var} = conv{i}(raw)")
    lines.append(f"    return cls({', '.join(args)})")
    env["empty"] = ""
    exec("\n".join(lines), env)  # noqa: S102 - code built from the class's own declarations
    return env["decode"]


def _compile_encoder(cls: type[Header], keys: Mapping[str, str] | None) -> Callable[[Any], dict[str, str]]:
    """``header -> extFields``: strings only (the C++ client ignores JSON numbers), booleans
    as true/false, absent (None) fields left out; ``keys`` renames wire keys."""
    lines = ["def encode(self):", "    out = {}"]
    for spec in cls._specs():
        wire = keys.get(spec.wire, spec.wire) if keys else spec.wire
        lines.append(f"    v = self.{spec.attr}")
        lines.append("    if v is not None:")
        if spec.kind == "bool":
            lines.append(f"        out[{wire!r}] = 'true' if v else 'false'")
        else:
            lines.append(f"        out[{wire!r}] = v if v.__class__ is str else "
                         "str(v) if v.__class__ is int else v if isinstance(v, str) else str(int(v))")
    lines.append("    return out")
    env: dict[str, Any] = {}
    exec("\n".join(lines), env)  # noqa: S102 - code built from the class's own declarations
    encode = env["encode"]
    _ENCODERS[(cls, None if keys is None else id(keys))] = encode
    return encode




def _bounds(spec: _Spec) -> tuple[int, int]:
    """The valid range of an integer field: its declared range within its Java type's."""
    type_lo, type_hi = _BOUNDS[spec.kind]
    return (type_lo if spec.lo is None else max(type_lo, spec.lo),
            type_hi if spec.hi is None else min(type_hi, spec.hi))


def _converter(cls: type[Header], spec: _Spec, name: str) -> Callable[[str], Any] | None:
    """A function from the wire string to the field's value, raising HeaderError; None for a
    plain string (no conversion, no check)."""
    code = cls.ERROR_CODE
    kind = spec.kind
    if kind == "str":
        choices = spec.choices
        if choices is None:
            return None

        def to_choice(raw: str) -> str:
            if raw not in choices:
                raise HeaderError(code, f"header field {name} must be one of "
                                        f"{', '.join(choices)}, got {raw!r}")
            return raw
        return to_choice
    if kind == "bool":
        def to_bool(raw: str) -> bool:
            value = _BOOLS.get(raw)
            if value is None:
                value = _BOOLS.get(raw.strip().lower())
                if value is None:
                    raise HeaderError(code, f"header field {name} must be a boolean "
                                            f"(true/false or 1/0), got {raw[:40]!r}")
            return value
        return to_bool
    type_lo, type_hi = _BOUNDS[kind]
    lo, hi = _bounds(spec)
    label = "an integer" if kind == "int" else "a long integer"
    width = "an int32" if kind == "int" else "an int64"

    def to_int(raw: str) -> int:
        try:
            if "_" in raw:  # Python's int() takes "1_000"; Java's parseLong does not
                raise ValueError
            value = int(raw)
        except ValueError:
            raise HeaderError(code, f"header field {name} must be {label}, "
                                    f"got {raw[:40]!r}") from None
        if lo <= value <= hi:
            return value
        if not type_lo <= value <= type_hi:
            raise HeaderError(code, f"header field {name} = {value} is out of range for {width}")
        if value < lo:
            raise HeaderError(code, f"header field {name} = {value} must be >= {lo}")
        raise HeaderError(code, f"header field {name} = {value} must be <= {hi}")
    return to_int


#: The decorator every header class takes: a keyword-only, slotted dataclass.
wire_header = dataclass(kw_only=True, slots=True)


#: The compiled twin of the generated decoders (``_header_codec.pyx``), when it was built and
#: ``TXBROKER_NO_EXTENSIONS`` is not set to a non-empty value; None: the generated Python code.
_CompiledDecoder: Any = None
if not os.environ.get("TXBROKER_NO_EXTENSIONS"):
    try:
        from txbroker.remoting._header_codec import Decoder as _CompiledDecoder
    except ImportError:
        pass
