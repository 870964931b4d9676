"""The compiled twins against their pure-Python references: same results, same errors.

``txbroker/remoting/_codec.pyx`` stands in for ``codec.py``'s ``FrameDecoder``,
``encode_parts`` and ``_decode_json_header`` when it was built, and ``_header_codec.pyx`` for
the header decoders ``header_codec.py`` generates.  These tests feed both the same random
valid and invalid input (whole frames, frames cut anywhere, garbage headers, lying prefixes,
extFields at and beyond each field's limits) and require equal commands and headers, equal
buffered bytes and, on a refusal, the same exception type, message and response code.  They skip when the extension was not built or is switched off
(``TXBROKER_NO_EXTENSIONS``), except the test that says which implementation is in use.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import os
import shutil
import struct
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import txbroker.remoting.controller_headers  # noqa: F401 - its Header classes are tested too
from txbroker._compiled import COMPILED, TWINS
from txbroker.remoting import codec, header_codec, headers
from txbroker.remoting.codes import SerializeType
from txbroker.remoting.command import RemotingCommand
from txbroker.store import record

_compiled = codec.IMPLEMENTATION == "compiled"
needs_extension = pytest.mark.skipif(not _compiled, reason="the compiled codec is not in use")
if _compiled:
    from txbroker.remoting import _codec
_PROFILE = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_int32 = st.integers(-(1 << 31), (1 << 31) - 1)
_text = st.text(max_size=30)
# JSON values a peer may put anywhere: the lenient and the refused kinds alike.
_json_scalar = (st.none() | st.booleans() | st.integers(-(1 << 40), 1 << 40) | _text
                | st.floats(allow_nan=False, allow_infinity=False, width=32))
#: Values at and beyond the edges of what a header field may hold.
_EDGES = [1 << 31, -(1 << 31) - 1, (1 << 31) - 1, -(1 << 31), 1 << 63, 1.0, 2.5, True, None, "1",
          [], {}, 7]
_json_value = st.recursive(_json_scalar, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)


@st.composite
def _headers(draw: st.DrawFn) -> bytes:
    """A JSON header: mostly the fields a client writes, sometimes ill-typed or missing ones,
    sometimes not JSON (or not UTF-8) at all."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=40))
    spoil = kind > 5  # else every field well-typed, as real clients write them
    doc: dict[str, object] = {}
    for name, good in (("code", _int32), ("opaque", _int32), ("flag", st.integers(0, 3)),
                       ("version", _int32), ("language", st.sampled_from(["JAVA", "CPP"])),
                       ("remark", st.none() | _text),
                       ("serializeTypeCurrentRPC", st.just("JSON"))):
        roll = draw(st.integers(0, 9)) if spoil else 9
        if roll == 0:
            continue  # missing
        if roll == 1:
            doc[name] = draw(st.sampled_from(_EDGES))
        else:
            doc[name] = draw(_json_value) if roll == 2 else draw(good)
    roll = draw(st.integers(0, 9)) if spoil else draw(st.integers(1, 5))
    if roll == 0:
        doc["extFields"] = draw(_json_value)
    elif roll < 8:
        values = _text if roll < 6 else _json_scalar
        doc["extFields"] = draw(st.dictionaries(st.text(min_size=1, max_size=8), values,
                                                max_size=6))
    raw = orjson.dumps(doc)
    return raw + b"\n" if draw(st.booleans()) else raw


@st.composite
def _frames(draw: st.DrawFn) -> bytes:
    """One frame: right prefixes mostly, lying lengths, unknown types and binary headers too."""
    header = draw(_headers())
    body = draw(st.binary(max_size=64))
    total = 4 + len(header) + len(body)
    mark = len(header)
    roll = draw(st.integers(0, 14))
    if roll == 0:
        total = draw(st.integers(-(1 << 31), (1 << 31) - 1))
    elif roll == 1:
        mark = draw(st.integers(-(1 << 31), (1 << 31) - 1))
    elif roll == 2:
        cmd = RemotingCommand(draw(st.integers(-(1 << 15), (1 << 15) - 1)), draw(_int32),
                              ext_fields=draw(st.dictionaries(_text, _text, max_size=3)),
                              body=body, serialize_type=SerializeType.ROCKETMQ)
        return codec.encode(cmd)
    return struct.pack(">ii", total, mark) + header + body


def _outcome(feed, chunks: list[bytes]) -> list[object]:
    """What each feed returned (commands, buffered count) or raised (type and message)."""
    seen: list[object] = []
    for chunk in chunks:
        try:
            seen.append(("ok", feed(chunk)))
        except Exception as exc:  # noqa: BLE001 - the exception itself is what is compared
            seen.append(("raised", type(exc), str(exc), getattr(exc, "code", None)))
    return seen


def _cut(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = [0, *sorted(c % (len(stream) + 1) for c in cuts), len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(points)]


@needs_extension
@_PROFILE
@given(st.lists(_frames(), min_size=1, max_size=5), st.lists(st.integers(0, 1 << 16), max_size=6),
       st.sampled_from([64, 4096, codec.DEFAULT_MAX_FRAME_SIZE, -1, 0, 1]), st.booleans())
def test_decoders_agree_on_any_stream_cut_anywhere(frames, cuts, limit, as_views) -> None:
    if limit <= 1:  # the first frame's size, a byte less or a byte more: the limit's edge
        limit = max(codec.PREFIX_SIZE, len(frames[0]) + limit)
    chunks = _cut(b"".join(frames), cuts)
    if as_views:
        chunks = [memoryview(bytearray(c)) for c in chunks]
    pure, compiled = codec.PyFrameDecoder(limit), _codec.FrameDecoder(limit)

    def pure_feed(chunk):
        return pure.feed(chunk), pure.buffered

    def compiled_feed(chunk):
        return compiled.feed(chunk), compiled.buffered
    assert _outcome(compiled_feed, chunks) == _outcome(pure_feed, chunks)


@needs_extension
@_PROFILE
@given(_headers())
def test_json_header_decoders_agree(raw: bytes) -> None:
    assert (_outcome(_codec._decode_json_header, [raw])
            == _outcome(codec.py_decode_json_header, [raw]))


_FIELDS = ["code", "opaque", "flag", "version", "language", "remark", "extFields",
           "serializeTypeCurrentRPC"]


@needs_extension
@pytest.mark.parametrize("name", _FIELDS)
@pytest.mark.parametrize("value", _EDGES + [{"k": 1}, {"k": 1.5}, {"k": None}, {"k": [1]}],
                         ids=repr)
def test_json_header_decoders_agree_on_every_field_at_its_edges(name: str, value) -> None:
    doc = {"code": 10, "opaque": 3, "flag": 0, "language": "JAVA", "version": 1,
           "extFields": {"a": "b"}, name: value}
    raw = orjson.dumps(doc)
    assert (_outcome(_codec._decode_json_header, [raw])
            == _outcome(codec.py_decode_json_header, [raw]))


@st.composite
def _commands(draw: st.DrawFn) -> RemotingCommand:
    """Commands as handlers build them: string or loose ext values, any body size, parts."""
    ext = draw(st.dictionaries(st.text(min_size=1, max_size=8),
                               _text | st.integers() | st.booleans() | st.none(), max_size=6))
    body = draw(st.binary(max_size=64) | st.just(b"\x01" * codec.SEPARATE_BODY_FROM))
    cmd = RemotingCommand(draw(_int32), draw(_int32), draw(st.integers(0, 3)),
                          draw(st.sampled_from(["JAVA", "PYTHON"])), draw(_int32),
                          draw(st.none() | _text), ext, body,
                          draw(st.sampled_from([SerializeType.JSON, SerializeType.ROCKETMQ])))
    roll = draw(st.integers(0, 5))
    if roll == 0:
        cmd.body = bytearray(body)
    elif roll == 1:
        cmd.body, cmd.body_parts = b"", draw(st.lists(st.binary(max_size=20), max_size=3))
    return cmd


@needs_extension
@_PROFILE
@given(_commands())
def test_encoders_agree(cmd: RemotingCommand) -> None:
    assert _outcome(_codec.encode_parts, [cmd]) == _outcome(codec.py_encode_parts, [cmd])


@needs_extension
def test_encoders_agree_on_an_oversize_header() -> None:
    cmd = RemotingCommand(10, remark="x" * codec.MAX_HEADER_SIZE)
    got = _outcome(_codec.encode_parts, [cmd])
    assert got == _outcome(codec.py_encode_parts, [cmd])
    assert got[0][:2] == ("raised", ValueError)


@needs_extension
def test_a_failed_compiled_decoder_refuses_more_input_like_the_reference() -> None:
    bad = struct.pack(">ii", 2, 0)
    chunks = [bad, struct.pack(">ii", 4, 0)]
    got = _outcome(_codec.FrameDecoder().feed, chunks)
    assert got == _outcome(codec.PyFrameDecoder().feed, chunks)
    assert got[1][2].startswith("decoder already failed: frame length 2 is below")


# --- header decoders ---------------------------------------------------------------------------


def _header_classes() -> list[type[header_codec.Header]]:
    found, todo = [], list(header_codec.Header.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls._specs():
            found.append(cls)
    return sorted(found, key=lambda c: c.__qualname__)


_HEADERS = [(cls, None) for cls in _header_classes()] + [(headers.SendMessageRequestHeader,
                                                          headers.SEND_V1_KEYS)]
#: Field values at the edges of what the converters accept, and beyond.
_RAW_EDGES = ["", "0", "1", "-1", "8", "12", "2147483647", "2147483648", "-2147483649",
              "9223372036854775807", "9223372036854775808", "1_000", " 7", "+5", "\u0663",
              "1.5", "true", "FALSE", " True ", "yes", "pending", "commit", "x" * 50]
_raw = st.sampled_from(_RAW_EDGES) | st.text(max_size=12) | st.integers(-3, 3).map(str)


@st.composite
def _header_input(draw: st.DrawFn):
    cls, keys = draw(st.sampled_from(_HEADERS))
    ext = {}
    for attr, wire, fallback, *_ in cls._plan(keys):
        roll = draw(st.integers(0, 9))
        if roll == 0:
            continue
        key = fallback if fallback is not None and roll == 1 else wire
        ext[key] = draw(_raw) if roll < 9 else draw(st.integers() | st.none() | st.booleans())
    return cls, keys, ext


@needs_extension
@_PROFILE
@given(_header_input())
def test_header_decoders_agree(case) -> None:
    cls, keys, ext = case
    pure = header_codec.python_decoder(cls, keys)
    compiled = header_codec.compiled_decoder(cls, keys)
    assert _outcome(compiled, [ext]) == _outcome(pure, [ext])


@needs_extension
@pytest.mark.parametrize("cls, keys", _HEADERS, ids=lambda v: getattr(v, "__name__", "keys"))
def test_header_decoders_agree_on_every_field_at_its_edges(cls, keys) -> None:
    pure = header_codec.python_decoder(cls, keys)
    compiled = header_codec.compiled_decoder(cls, keys)
    good = {wire: "1" for _, wire, *_ in cls._plan(keys)}
    cases = [good, {}]
    for _, wire, *_ in cls._plan(keys):
        cases += [{**good, wire: raw} for raw in _RAW_EDGES]
        cases.append({k: v for k, v in good.items() if k != wire})
    for ext in cases:
        assert _outcome(compiled, [ext]) == _outcome(pure, [ext]), ext


# --- record decode -----------------------------------------------------------------------------


def _pure_module(name: str) -> types.ModuleType:
    """A private copy of module ``name`` loaded with the extensions off: the reference whole,
    even where the module itself calls a function the compiled twin replaced."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None
    before = os.environ.get("TXBROKER_NO_EXTENSIONS")
    os.environ["TXBROKER_NO_EXTENSIONS"] = "1"
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if before is None:
            del os.environ["TXBROKER_NO_EXTENSIONS"]
        else:
            os.environ["TXBROKER_NO_EXTENSIONS"] = before
    return module


_pure_record = _pure_module("txbroker.store.record")
_record_compiled = record.decode_record.__module__ == "txbroker.store._record"
needs_record_extension = pytest.mark.skipif(not _record_compiled,
                                            reason="the compiled record codec is not in use")


def _plain(value: object) -> object:
    """``value`` comparable across the two module copies (their classes are distinct)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__name__, dataclasses.asdict(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _record_outcome(func, *args, **kwargs) -> tuple[object, ...]:
    try:
        return ("ok", _plain(func(*args, **kwargs)))
    except Exception as exc:  # noqa: BLE001 - the exception itself is what is compared
        return ("raised", type(exc).__name__, str(exc))


_prop_text = st.text(alphabet=st.sampled_from("ab\x01\x02\u00e9\U0001f600 "), max_size=24)
_int64 = st.integers(0, (1 << 63) - 1)


@st.composite
def _records(draw: st.DrawFn) -> bytes:
    """A stored record: well-formed, or damaged (bytes changed, cut short, lengthened)."""
    ip = ".".join(str(draw(st.integers(0, 255))) for _ in range(4))
    msg = record.Message(
        topic=draw(st.text(min_size=1, max_size=12)), queue_id=draw(_int32),
        body=draw(st.binary(max_size=40)), flag=draw(_int32),
        properties=draw(st.dictionaries(st.text(alphabet="kKé", min_size=1, max_size=4),
                                        st.text(alphabet="vV ü", min_size=0, max_size=6),
                                        max_size=4)),
        sys_flag=draw(st.integers(0, 0xFF)), born_timestamp=draw(_int64),
        born_host=(ip, draw(_int32)), reconsume_times=draw(_int32),
        prepared_transaction_offset=draw(_int64))
    raw = bytearray(record.encode_record(
        msg, physical_offset=draw(_int64), queue_offset=draw(_int64),
        store_timestamp=draw(_int64), store_host=(ip, draw(_int32))))
    roll = draw(st.integers(0, 9))
    if roll == 0:
        for _ in range(draw(st.integers(1, 3))):
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    elif roll == 1:
        del raw[draw(st.integers(0, len(raw) - 1)):]
    elif roll == 2:
        raw += draw(st.binary(min_size=1, max_size=8))
    elif roll == 3:
        # A sys flag with an IPv6 host bit: the store writes none, a peer might.
        raw[39] |= draw(st.sampled_from([0x10, 0x20]))
    return bytes(raw)


@needs_record_extension
@_PROFILE
@given(st.lists(_records(), min_size=1, max_size=3), st.booleans(), st.integers(0, 3),
       st.booleans())
def test_record_decoders_agree(records, check_crc, pos, as_view) -> None:
    buf: bytes | memoryview = b"".join(records)
    if as_view:
        buf = memoryview(buf)
    for name in ("decode_records", "decode_record"):
        args = (buf,) if name == "decode_records" else (buf, pos if pos < 3 else len(records[0]))
        assert (_record_outcome(getattr(record, name), *args, check_crc=check_crc)
                == _record_outcome(getattr(_pure_record, name), *args, check_crc=check_crc))


@needs_record_extension
@_PROFILE
@given(_prop_text | st.none() | st.just(""))
def test_properties_parsers_agree(text) -> None:
    assert (_record_outcome(record.string_to_properties, text)
            == _record_outcome(_pure_record.string_to_properties, text))


def _version(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TXBROKER_NO_EXTENSIONS"}
    if env_value is not None:
        env["TXBROKER_NO_EXTENSIONS"] = env_value
    cli = Path(sys.executable).with_name("txbroker")
    run = subprocess.run([str(cli), "--version"], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    return run.stdout


def test_version_says_which_hot_path_is_in_use() -> None:
    assert "hot path: pure Python" in _version("1")
    # An empty value does not switch the extensions off.
    assert f"hot path: {'compiled' if _built() else 'pure Python'}" in _version("")


def test_the_switch_is_a_variable_the_servers_know() -> None:
    """``txbroker serve`` refuses unknown TXBROKER_* variables; the switch is not one."""
    env = {**os.environ, "TXBROKER_NO_EXTENSIONS": "1"}
    cli = Path(sys.executable).with_name("txbroker")
    run = subprocess.run([str(cli), "serve", "--print-config"], env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("[broker]")


def _built() -> bool:
    """Whether the extension exists on this machine, whatever this process uses."""
    try:
        from txbroker.remoting import _codec as built  # noqa: F401
    except ImportError:
        return False
    return True


# --- the build -------------------------------------------------------------------------------

_REPO = Path(__file__).resolve().parents[1]


def _build_wheel(tmp_path: Path, cc: str | None) -> tuple[list[str], str]:
    """Build a wheel from a copy of the sources (``cc``: the C compiler to use); its file
    names and pip's verbose output."""
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("*.so", "*.c", "__pycache__", "*.egg-info")
    for name in ("txbroker", "cli", "bench"):
        shutil.copytree(_REPO / name, src / name, ignore=skip)
    for name in ("setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md"):
        shutil.copy(_REPO / name, src / name)
    env = dict(os.environ)
    if cc is not None:
        env["CC"] = cc
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w",
                          str(tmp_path / "wheel"), str(src)], env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    [wheel] = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist(), run.stdout + run.stderr


@pytest.mark.slow
def test_without_a_compiler_the_build_installs_the_pure_package_with_a_warning(tmp_path) -> None:
    names, output = _build_wheel(tmp_path, "/bin/false")
    assert "txbroker/remoting/codec.py" in names
    assert not [n for n in names if n.endswith((".so", ".c", ".pyx"))], names
    assert "WARNING: txbroker's compiled hot path was not built" in output


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")
def test_with_a_compiler_the_wheel_carries_the_extensions(tmp_path) -> None:
    names, _ = _build_wheel(tmp_path, None)
    built = sorted(n.split(".")[0] for n in names if n.endswith(".so"))
    assert built == sorted(name.replace(".", "/") for name in TWINS + COMPILED)
    # the sources of the modules compiled whole ship too: TXBROKER_NO_EXTENSIONS=1 runs them
    assert all(name.replace(".", "/") + ".py" in names for name in COMPILED)
