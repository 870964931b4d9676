"""The command both ends of the remoting protocol exchange, independent of its serialization.

:class:`RemotingCommand` is what the SDK builds and the broker's handlers answer; the codec
(``codec.py``, with the binary header in ``binary.py``) turns it into frames and back, and
:class:`ProtocolError` is how the codec says the peer's bytes are not a frame.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from txbroker.remoting.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    VERSION_4_9_8,
    LanguageCode,
    ResponseCode,
    SerializeType,
)

#: RocketMQ language names by ordinal: a binary header carries the ordinal, a JSON header the
#: name (some writers the ordinal), ``RemotingCommand.language`` always the name.
LANGUAGE_NAMES = {int(lang): lang.name for lang in LanguageCode}


class ProtocolError(Exception):
    """The peer sent bytes that are not a valid frame; the connection cannot continue.

    ``code`` is the response code a server would answer with if it still could; the message
    says what exactly is wrong (it is logged when the connection is closed).
    """

    def __init__(self, message: str, code: int = ResponseCode.SYSTEM_ERROR) -> None:
        super().__init__(message)
        self.code = int(code)


@dataclass(slots=True)
class RemotingCommand:
    """One request or response, independent of its serialization.

    ``ext_fields`` holds strings only (the codec normalises what peers send); ``language`` is
    the RocketMQ language name (``"JAVA"``, ``"CPP"``, ...).
    """

    code: int
    opaque: int = 0
    flag: int = 0
    language: str = "PYTHON"
    version: int = VERSION_4_9_8
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    serialize_type: int = SerializeType.JSON
    #: An outgoing body given as buffers instead (``body`` is then empty): the frame carries
    #: their concatenation, written to the socket as they are (see ``codec.encode_parts``), so
    #: a pulled batch of stored records is never joined into a new byte string.  Decoded
    #: commands always have ``body`` and no parts.
    body_parts: list[bytes] | None = None

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    @classmethod
    def request(cls, code: int, ext: dict[str, str] | None = None, body: bytes = b"",
                *, oneway: bool = False, opaque: int = 0,
                serialize_type: int = SerializeType.JSON) -> RemotingCommand:
        """A request; the transport that sends it assigns the opaque."""
        return cls(code=int(code), opaque=opaque, flag=FLAG_ONEWAY if oneway else 0,
                   ext_fields=dict(ext) if ext else {}, body=body,
                   serialize_type=serialize_type)

    def response(self, code: int = ResponseCode.SUCCESS, remark: str | None = None,
                 ext: dict[str, str] | None = None, body: bytes = b"") -> RemotingCommand:
        """The answer to this request: same opaque and serialization, response bit set."""
        return RemotingCommand(code, self.opaque, FLAG_RESPONSE, "PYTHON", VERSION_4_9_8, remark,
                               dict(ext) if ext else {}, body, self.serialize_type)


def string_fields(ext: dict[str, Any]) -> dict[str, str]:
    """``ext`` with string values only, as every encoder writes it: the C++ client ignores
    numeric values.  None values are left out; ``ext`` itself when it is already all strings."""
    for value in ext.values():
        if value.__class__ is not str:
            break
    else:
        return ext
    out: dict[str, str] = {}
    for key, value in ext.items():
        if value is None:
            continue
        if value.__class__ is bool:
            out[key] = "true" if value else "false"
        else:
            out[key] = value if value.__class__ is str else str(value)
    return out
