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
tests check for random values.  END_TRANSACTION gets the same treatment.

Sans-IO: bytes in, bytes out; the connection assigns the opaque and writes the buffers
(:meth:`txbroker.remoting.client.RemotingClient.invoke` takes a :class:`FilledRequest` as
well as a command).  A connection that signs its requests (access control) asks for the
request as a :class:`RemotingCommand` instead, since the signature covers every field.
"""

from __future__ import annotations

import struct

import orjson

from txbroker.remoting.codec import SEPARATE_BODY_FROM, encode
from txbroker.remoting.codes import FLAG_ONEWAY
from txbroker.remoting.command import RemotingCommand

#: A frame's length prefix: total length after this field, then the serialize type (JSON: 0)
#: and header length in one int (docs/protocol.md §3).
_PREFIX = struct.Struct(">ii")
#: The opaque the template is encoded with, found and cut out afterwards; any int32 works,
#: one with many digits cannot be mistaken for a field's value followed by the opaque key.
_PROBE_OPAQUE = 1987654321
_OPAQUE = -1  # in ``FrameTemplate._slots``: this hole takes the opaque


class FrameTemplate:
    """One request's JSON frame with holes for ``holes`` (ext keys) and the opaque.

    ``ext`` holds every field of the request, the holes' values included (any value: each
    request brings its own); the template keeps the key order of ``ext``, as the generic
    encoder does.  Immutable once built; shared by every request of its kind.
    """

    __slots__ = ("_pieces", "_slots", "code", "ext", "flag", "holes")

    def __init__(self, code: int, ext: dict[str, str], holes: tuple[str, ...], *,
                 oneway: bool = False) -> None:
        self.code = int(code)
        self.flag = FLAG_ONEWAY if oneway else 0
        self.ext = dict(ext)
        self.holes = holes
        probe = dict(ext)
        markers: list[tuple[bytes, int]] = [(b'"opaque":%d' % _PROBE_OPAQUE, _OPAQUE)]
        for i, key in enumerate(holes):
            if key not in probe:
                raise ValueError(f"hole {key!r} is not a field of the request")
            # NUL cannot occur in an encoded header (JSON escapes it), so the marker is unique.
            probe[key] = f"\x00{i}\x00"
            markers.append((orjson.dumps(probe[key]), i))
        header = encode(RemotingCommand(self.code, _PROBE_OPAQUE, self.flag, ext_fields=probe))
        header = header[_PREFIX.size:]
        found = []
        for marker, slot in markers:
            at = header.find(marker)
            if at < 0 or header.find(marker, at + 1) >= 0:
                raise ValueError(f"placeholder {marker!r} not found once in the encoded header")
            if slot == _OPAQUE:  # keep the key, cut the number
                at += len(b'"opaque":')
                marker = marker[len(b'"opaque":'):]
            found.append((at, len(marker), slot))
        found.sort()
        pieces, slots, pos = [], [], 0
        for at, length, slot in found:
            pieces.append(header[pos:at])
            slots.append(slot)
            pos = at + length
        pieces.append(header[pos:])
        self._pieces = tuple(pieces)
        self._slots = tuple(slots)

    def fill(self, values: tuple[str, ...], body: bytes = b"") -> FilledRequest:
        """This request with ``values`` in its holes (in the order of ``holes``)."""
        return FilledRequest(self, values, body)

    def frame(self, opaque: int, values: tuple[str, ...], body: bytes) -> list[bytes]:
        """The frame's buffers, as :func:`txbroker.remoting.codec.encode_parts` returns them."""
        pieces = self._pieces
        out = [pieces[0]]
        i = 1
        for slot in self._slots:
            out.append(str(opaque).encode() if slot < 0 else orjson.dumps(values[slot]))
            out.append(pieces[i])
            i += 1
        header = b"".join(out)
        header_len = len(header)
        if len(body) < SEPARATE_BODY_FROM:
            return [_PREFIX.pack(4 + header_len + len(body), header_len) + header + body]
        return [_PREFIX.pack(4 + header_len + len(body), header_len) + header, body]

    def command(self, values: tuple[str, ...], body: bytes = b"") -> RemotingCommand:
        """The same request as a command, for the generic encoder (and a signing end)."""
        ext = self.ext.copy()
        for key, value in zip(self.holes, values, strict=True):
            ext[key] = value
        return RemotingCommand(self.code, flag=self.flag, ext_fields=ext, body=body)


class FilledRequest:
    """A template with its values: what :meth:`RemotingClient.invoke` sends for it."""

    __slots__ = ("body", "template", "values")

    def __init__(self, template: FrameTemplate, values: tuple[str, ...], body: bytes) -> None:
        self.template = template
        self.values = values
        self.body = body

    def frame(self, opaque: int) -> list[bytes]:
        return self.template.frame(opaque, self.values, self.body)

    def command(self) -> RemotingCommand:
        return self.template.command(self.values, self.body)
