"""Codec properties checked with hypothesis; the CI tests run them small, this module large.

``python -m txbroker.bench.chaos.codecfuzz --examples 20000`` runs every property with that many
examples and prints one line per property (exit 1 on a falsifying example).
"""

from __future__ import annotations

import argparse
import sys
import time

from txbroker.bench.extras import fail_if_missing
from txbroker.remoting.codec import FrameDecoder, decode_frame, encode
from txbroker.remoting.command import ProtocolError, RemotingCommand

PROG = "python -m txbroker.bench.chaos.codecfuzz"

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ModuleNotFoundError as exc:  # run as a program without hypothesis: one error line
    if __name__ == "__main__":
        fail_if_missing(exc, PROG)
    raise

ext_values = st.dictionaries(st.text(min_size=1, max_size=12), st.text(max_size=40), max_size=6)


@given(st.binary(max_size=512), st.integers(min_value=1, max_value=64))
def arbitrary_bytes_yield_commands_or_protocol_error(data: bytes, chunk: int) -> None:
    decoder = FrameDecoder(4096)
    try:
        for i in range(0, len(data), chunk):
            for cmd in decoder.feed(data[i:i + chunk]):
                assert isinstance(cmd, RemotingCommand)
    except ProtocolError:
        pass


@given(code=st.integers(min_value=0, max_value=32767), opaque=st.integers(min_value=0, max_value=2**31 - 1),
       ext=ext_values, body=st.binary(max_size=256), remark=st.none() | st.text(max_size=40))
def encode_decode_round_trip(code: int, opaque: int, ext: dict, body: bytes, remark: str | None) -> None:
    cmd = RemotingCommand.request(code, ext, body, opaque=opaque)
    cmd.remark = remark
    back = decode_frame(encode(cmd))
    assert (back.code, back.opaque, back.ext_fields, back.body, back.remark) == (code, opaque, ext, body, remark)


@given(ext=ext_values, body=st.binary(max_size=64), flips=st.lists(
    st.tuples(st.integers(min_value=0, max_value=10_000), st.integers(min_value=1, max_value=255)),
    min_size=1, max_size=4))
def damaged_frames_raise_only_protocol_error(ext: dict, body: bytes, flips: list) -> None:
    data = bytearray(encode(RemotingCommand.request(10, ext, body, opaque=1)))
    for pos, x in flips:
        data[pos % len(data)] ^= x
    try:
        FrameDecoder(1 << 20).feed(bytes(data))
    except ProtocolError:
        pass


@given(cmds=st.lists(st.tuples(st.integers(min_value=0, max_value=400), ext_values, st.binary(max_size=64)),
                     min_size=1, max_size=5),
       cuts=st.lists(st.integers(min_value=1, max_value=50), max_size=20))
def stream_split_anywhere_decodes_the_same(cmds: list, cuts: list) -> None:
    stream = b"".join(encode(RemotingCommand.request(c, e, b, opaque=i)) for i, (c, e, b) in enumerate(cmds))
    decoder, out, pos = FrameDecoder(), [], 0
    for n in [*cuts, len(stream)]:
        out += decoder.feed(stream[pos:pos + n])
        pos += n
    out += decoder.feed(stream[pos:])
    assert [(c.code, c.ext_fields, c.body) for c in out] == cmds


PROPERTIES = (arbitrary_bytes_yield_commands_or_protocol_error, encode_decode_round_trip,
              damaged_frames_raise_only_protocol_error, stream_split_anywhere_decodes_the_same)


def run(prop, examples: int) -> None:
    settings(max_examples=examples, deadline=None, database=None,
             suppress_health_check=list(HealthCheck))(prop)()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__)
    ap.add_argument("--examples", type=int, default=20000)
    args = ap.parse_args(argv)
    failed = 0
    for prop in PROPERTIES:
        t0 = time.monotonic()
        try:
            run(prop, args.examples)
            status = "ok"
        except Exception as exc:  # noqa: BLE001 - report every falsified property, then exit 1
            status, failed = f"FALSIFIED: {exc!r}", failed + 1
        print(f"{prop.__name__:<52} {args.examples:>7} examples  {time.monotonic() - t0:6.1f}s  {status}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
