"""The rules of a RocketMQ 4.x ``plain_acl.yml``: the file read, checked and turned into
:class:`AclRules` before the broker starts.

Kept apart from the request check (``service/acl.py``), which only reads the rules: a file
RocketMQ would half-accept (an unknown permission word read as DENY, a typo in a key ignored)
is refused here with the entry's meaning spelled out, so a broker never runs with rules other
than the ones its operator wrote.
"""

from __future__ import annotations

import enum
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from txbroker.config import ConfigError
from txbroker.store.record import RETRY_GROUP_TOPIC_PREFIX

#: RocketMQ's AclConstants: keys and secrets must be longer than this.
MIN_KEY_LENGTH = 6


class AclConfigError(ConfigError):
    """The ACL file cannot be used; the message names the file and the offending entry."""


class Perm(enum.IntFlag):
    """RocketMQ's ``Permission`` bits."""

    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8


_PERM_WORDS = {"DENY": Perm.DENY, "PUB": Perm.PUB, "SUB": Perm.SUB,
               "PUB|SUB": Perm.PUB | Perm.SUB, "SUB|PUB": Perm.PUB | Perm.SUB}


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


# --- remote address patterns -------------------------------------------------------------------


@dataclass(frozen=True)
class AddressPattern:
    """A ``whiteRemoteAddress`` pattern, in RocketMQ's forms.

    ``*`` (or ``*.*.*.*``, ``*:*:*:*:*:*:*:*``) matches everyone; ``a,b,c`` and
    ``192.168.1.{1,2}`` list exact addresses; ``192.168.1.*`` or ``192.168.1.10-20`` give a
    range per part (IPv6 ranges need all eight groups written out); anything else is one exact
    address.  ``alternatives`` holds, per matching address form, its version and the allowed
    ``(low, high)`` range of each part (4 octets or 8 groups).
    """

    text: str
    any: bool = False
    alternatives: tuple[tuple[int, tuple[tuple[int, int], ...]], ...] = ()

    @classmethod
    def parse(cls, text: str) -> AddressPattern:
        t = text.strip()
        if not t:
            raise ValueError("empty address pattern")
        if t in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
            return cls(t, any=True)
        if t.endswith("}"):
            head, sep, rest = t.partition("{")
            if not sep or not head or head[-1] not in ".:":
                raise ValueError(f"{t!r}: a {{a,b}} list must be the last part of the address")
            return cls(t, alternatives=tuple(_exact(head + x.strip()) for x in rest[:-1].split(",")))
        if "," in t:
            return cls(t, alternatives=tuple(_exact(x.strip()) for x in t.split(",")))
        if "*" in t or "-" in t:
            return cls(t, alternatives=(_ranges(t),))
        return cls(t, alternatives=(_exact(t),))

    def matches(self, host: str) -> bool:
        if self.any:
            return True
        parts = _address_parts(host)
        if parts is None:
            return False
        version, values = parts
        return any(v == version and all(lo <= x <= hi for x, (lo, hi) in zip(values, ranges, strict=True))
                   for v, ranges in self.alternatives)


def _exact(text: str) -> tuple[int, tuple[tuple[int, int], ...]]:
    parts = _address_parts(text)
    if parts is None:
        raise ValueError(f"{text!r} is not an IPv4 or IPv6 address")
    version, values = parts
    return version, tuple((x, x) for x in values)


def _ranges(text: str) -> tuple[int, tuple[tuple[int, int], ...]]:
    v6 = ":" in text
    pieces = text.split(":" if v6 else ".")
    size, top, base = (8, 0xFFFF, 16) if v6 else (4, 255, 10)
    if not v6 and 1 < len(pieces) < size and pieces[-1].strip() == "*":
        pieces += ["*"] * (size - len(pieces))  # RocketMQ reads "192.168.*" as "192.168.*.*"
    if len(pieces) != size:
        raise ValueError(f"{text!r}: a range pattern needs {size} parts"
                         + (" (write IPv6 ranges without '::')" if v6 else ""))
    out = []
    for piece in pieces:
        piece = piece.strip()
        try:
            if piece == "*":
                lo, hi = 0, top
            elif "-" in piece:
                a, b = piece.split("-", 1)
                lo, hi = int(a, base), int(b, base)
            else:
                lo = hi = int(piece, base)
        except ValueError:
            raise ValueError(f"{text!r}: {piece!r} is not a number, a-b range or *") from None
        if not 0 <= lo <= hi <= top:
            raise ValueError(f"{text!r}: {piece!r} is outside 0..{top} or reversed")
        out.append((lo, hi))
    return (6 if v6 else 4), tuple(out)


def _address_parts(host: str) -> tuple[int, tuple[int, ...]] | None:
    """(4, octets) or (6, groups) of an address; IPv4-mapped IPv6 counts as IPv4."""
    try:
        ip = ipaddress.ip_address(host.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.version == 4:
        return 4, tuple(ip.packed)
    packed = ip.packed
    return 6, tuple(int.from_bytes(packed[i:i + 2], "big") for i in range(0, 16, 2))


# --- the file ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Account:
    access_key: str
    secret_key: str
    white_remote_address: AddressPattern | None = None
    admin: bool = False
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.DENY
    #: topic name or ``%RETRY%<group>`` → permission
    resource_perms: Mapping[str, Perm] = field(default_factory=dict)

    def __repr__(self) -> str:  # never print the secret
        return f"Account(access_key={self.access_key!r}, admin={self.admin})"


@dataclass(frozen=True)
class AclRules:
    global_white: tuple[AddressPattern, ...] = ()
    accounts: Mapping[str, Account] = field(default_factory=dict)


_TOP_KEYS = {"globalWhiteRemoteAddresses", "accounts", "dataVersion"}
_ACCOUNT_KEYS = {"accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm",
                 "defaultGroupPerm", "topicPerms", "groupPerms"}


def load_acl_file(path: str | os.PathLike[str]) -> AclRules:
    """Read and check a ``plain_acl.yml``; :class:`AclConfigError` says what is wrong where."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except OSError as exc:
        raise AclConfigError(f"acl file {path}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise AclConfigError(f"acl file {path}: not valid YAML: {exc}") from None
    try:
        return parse_acl(doc)
    except (ValueError, TypeError) as exc:
        raise AclConfigError(f"acl file {path}: {exc}") from None


def parse_acl(doc: Any) -> AclRules:
    """The rules of a parsed ``plain_acl.yml`` document.

    Raises ValueError for a bad value and TypeError for a wrong shape (a list where a mapping
    belongs, ...), each naming the entry.
    """
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise TypeError("the top level must be a mapping with 'accounts' and "
                         "'globalWhiteRemoteAddresses'")
    unknown = sorted(set(map(str, doc)) - _TOP_KEYS)
    if unknown:
        raise ValueError(f"unknown top-level key(s) {', '.join(unknown)} "
                         f"(expected {', '.join(sorted(_TOP_KEYS))})")
    white = []
    for i, text in enumerate(_list(doc, "globalWhiteRemoteAddresses", "")):
        white.append(_pattern(text, f"globalWhiteRemoteAddresses[{i}]"))
    accounts: dict[str, Account] = {}
    for i, entry in enumerate(_list(doc, "accounts", "")):
        account = _account(entry, f"accounts[{i}]")
        if account.access_key in accounts:
            raise ValueError(f"accounts[{i}]: accessKey {account.access_key!r} is listed twice")
        accounts[account.access_key] = account
    return AclRules(tuple(white), accounts)


def _list(doc: dict, key: str, where: str) -> list:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"{where}{key} must be a list")
    return value


def _pattern(text: Any, where: str) -> AddressPattern:
    if not isinstance(text, str):
        raise TypeError(f"{where}: {text!r} is not an address pattern")
    try:
        return AddressPattern.parse(text)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _key(entry: dict, name: str, where: str) -> str:
    value = entry.get(name)
    # YAML reads ``secretKey: 12345678`` as a number; RocketMQ uses its text.
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or len(value) <= MIN_KEY_LENGTH:
        raise ValueError(f"{where}: {name} must be a string longer than {MIN_KEY_LENGTH} "
                         f"characters (RocketMQ's rule)")
    return value


def _perm(text: Any, where: str) -> Perm:
    if text is None:
        return Perm.DENY
    perm = _PERM_WORDS.get(str(text).strip().replace(" ", ""))
    if perm is None:
        raise ValueError(f"{where}: {text!r} is not a permission (DENY, PUB, SUB or PUB|SUB)")
    return perm


def _account(entry: Any, where: str) -> Account:
    if not isinstance(entry, dict):
        raise TypeError(f"{where} must be a mapping with accessKey, secretKey, ...")
    unknown = sorted(set(map(str, entry)) - _ACCOUNT_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} "
                         f"(expected {', '.join(sorted(_ACCOUNT_KEYS))})")
    access_key = _key(entry, "accessKey", where)
    where = f"{where} ({access_key})"
    admin = entry.get("admin", False)
    if admin is None:
        admin = False
    if not isinstance(admin, bool):
        raise TypeError(f"{where}: admin must be true or false, not {admin!r}")
    white = entry.get("whiteRemoteAddress")
    if white is not None and not isinstance(white, str):
        raise TypeError(f"{where}: whiteRemoteAddress must be one address pattern, not {white!r}")
    perms: dict[str, Perm] = {}
    for key, is_topic in (("topicPerms", True), ("groupPerms", False)):
        for i, item in enumerate(_list(entry, key, f"{where}: ")):
            name, sep, word = str(item).partition("=")
            if not sep or not name.strip() or "=" in word:
                raise ValueError(f"{where}: {key}[{i}] {item!r} must look like 'name=PUB|SUB'")
            resource = name.strip() if is_topic else retry_topic(name.strip())
            if resource in perms:
                raise ValueError(f"{where}: {key}[{i}] lists {name.strip()!r} twice")
            perms[resource] = _perm(word, f"{where}: {key}[{i}]")
    return Account(
        access_key=access_key,
        secret_key=_key(entry, "secretKey", where),
        white_remote_address=(_pattern(white, f"{where}: whiteRemoteAddress")
                              if isinstance(white, str) and white.strip() else None),
        admin=admin,
        default_topic_perm=_perm(entry.get("defaultTopicPerm"), f"{where}: defaultTopicPerm"),
        default_group_perm=_perm(entry.get("defaultGroupPerm"), f"{where}: defaultGroupPerm"),
        resource_perms=perms,
    )
