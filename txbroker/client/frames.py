"""Request frames encoded once and filled in per request: the SDK's hottest requests as bytes.

A producer sends the same SEND_MESSAGE_V2 header again and again: group, topic, sys flag and
a dozen other fields stay the same, only the queue id, the born timestamp and the properties
differ, and the connection adds the opaque.  Building the ext dict, normalising it and JSON
encoding the whole header per send cost more than the rest of the send's own Python work, so
a :class:`FrameTemplate` encodes the request once, with the generic encoder
(:func:`txbroker.remoting.codec.encode`) and a recognisable placeholder in each varying field,
and keeps the constant bytes between the placeholders.  A request then is those pieces
joined with the varying values, JSON-encoded one by one exactly as the generic encoder
encodes them inside the header: the bytes on the wire are the generic encoder's, which the
tests check for random values.  END_TRANSACTION and a consumer's PULL get the same treatment.

Sans-IO: bytes in, bytes out; the connection assigns the opaque and writes the buffers
(:meth:`txbroker.remoting.client.RemotingClient.invoke` takes a :class:`FilledRequest` as
well as a command).  A connection that signs its requests (access control) asks for the
request as a :class:`RemotingCommand` instead, since the signature covers every field.
"""

from __future__ import annotations

import struct
from operator import call

import orjson

from txbroker.remoting.codec import SEPARATE_BODY_FROM, encode
from txbroker.remoting.codes import FLAG_ONEWAY
from txbroker.remoting.command import RemotingCommand

#: A frame's length prefix: total length after this field, then the serialize type (JSON: 0)
#: and header length in one int (docs/protocol.md §1).
_PREFIX = struct.Struct(">ii")
#: The opaque the template is encoded with, found and cut out afterwards; any int32 works,
#: one with many digits cannot be mistaken for a field's value followed by the opaque key.
_PROBE_OPAQUE = 1987654321
_dumps = orjson.dumps


class FrameTemplate:
    """One request's JSON frame with holes for ``holes`` (ext keys) and the opaque.

    ``ext`` holds every field of the request, the holes' values included (any value: each
    request brings its own); the template keeps the key order of ``ext``, as the generic
    encoder does, and ``holes`` must be listed in that order.  A hole named in ``ints``
    takes an ``int`` (written as its decimal string, as the header classes write integers),
    any other a ``str``.  Immutable once built; shared by every request of its kind.
    """

    __slots__ = ("_converters", "_format", "code", "ext", "flag", "holes", "ints")

    def __init__(self, code: int, ext: dict[str, str], holes: tuple[str, ...], *,
                 ints: frozenset[str] = frozenset(), oneway: bool = False) -> None:
        self.code = int(code)
        self.flag = FLAG_ONEWAY if oneway else 0
        self.ext = dict(ext)
        self.holes = holes
        self.ints = ints
        probe = dict(ext)
        markers = []
        for i, key in enumerate(holes):
            if key not in probe:
                raise ValueError(f"hole {key!r} is not a field of the request")
            # NUL cannot occur in an encoded header (JSON escapes it), so the marker is unique.
            probe[key] = f"\x00{i}\x00"
            markers.append(orjson.dumps(probe[key]))
        header = encode(RemotingCommand(self.code, _PROBE_OPAQUE, self.flag, ext_fields=probe))
        header = header[_PREFIX.size:]
        opaque = b'"opaque":%d' % _PROBE_OPAQUE
        pieces, pos = [], 0
        for key, marker in (*zip(holes, markers, strict=True), (None, opaque)):
            at = header.find(marker, pos)
            if at < 0 or header.find(marker, at + 1) >= 0:
                raise ValueError(f"placeholder {marker!r} not found once after the previous "
                                 "hole (holes are listed in the header's key order)")
            if key is None:  # keep the key, leave the number out
                pieces.append(header[pos:at + len(b'"opaque":')].replace(b"%", b"%%") + b"%d")
            elif key in ints:  # inside the quotes, as orjson writes str(int)
                pieces.append(header[pos:at + 1].replace(b"%", b"%%") + b'%d"')
            else:
                pieces.append(header[pos:at].replace(b"%", b"%%") + b"%b")
            pos = at + len(marker)
        pieces.append(header[pos:].replace(b"%", b"%%"))
        #: The header as a bytes format: ``%b`` takes a JSON-encoded string, ``%d`` an int.
        self._format = b"".join(pieces)
        self._converters = tuple(int if key in ints else _dumps for key in holes)

    def fill(self, values: tuple, body: bytes = b"") -> FilledRequest:
        """This request with ``values`` in its holes (in the order of ``holes``)."""
        return FilledRequest(self, values, body)

    def frame(self, opaque: int, values: tuple, body: bytes) -> list[bytes]:
        """The frame's buffers, as :func:`txbroker.remoting.codec.encode_parts` returns them."""
        # Each value through its hole's converter (int or orjson.dumps), all in C.
        header = self._format % (*map(call, self._converters, values), opaque)
        header_len = len(header)
        if len(body) < SEPARATE_BODY_FROM:
            return [_PREFIX.pack(4 + header_len + len(body), header_len) + header + body]
        return [_PREFIX.pack(4 + header_len + len(body), header_len) + header, body]

    def command(self, values: tuple, body: bytes = b"") -> RemotingCommand:
        """The same request as a command, for the generic encoder (and a signing end)."""
        ext = self.ext.copy()
        for key, value in zip(self.holes, values, strict=True):
            ext[key] = str(value) if key in self.ints else value
        return RemotingCommand(self.code, flag=self.flag, ext_fields=ext, body=body)


class FilledRequest:
    """A template with its values: what :meth:`RemotingClient.invoke` sends for it."""

    __slots__ = ("body", "template", "values")

    def __init__(self, template: FrameTemplate, values: tuple, body: bytes) -> None:
        self.template = template
        self.values = values
        self.body = body

    def frame(self, opaque: int) -> list[bytes]:
        return self.template.frame(opaque, self.values, self.body)

    def command(self) -> RemotingCommand:
        return self.template.command(self.values, self.body)
