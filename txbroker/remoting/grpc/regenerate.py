"""Regenerate the committed protobuf and gRPC stubs of RocketMQ 5's ``MessagingService``.

The stubs beside this module (``definition_pb2``, ``service_pb2``, ``service_pb2_grpc`` and
their ``.pyi``) are generated from apache/rocketmq-apis at the commit named in
:data:`APIS_COMMIT` and committed, so neither an install nor a start needs protoc.  To move to
another commit of the protocol (docs/grpc.md, "Stubs")::

    git clone https://github.com/apache/rocketmq-apis /tmp/rocketmq-apis
    git -C /tmp/rocketmq-apis checkout <commit>
    python -m txbroker.remoting.grpc.regenerate /tmp/rocketmq-apis

then update :data:`APIS_COMMIT`.  It needs ``grpcio-tools`` (in the ``test`` extra).  The
generated modules import each other as ``apache.rocketmq.v2``; that import is rewritten to this
package, and the descriptors keep their upstream file names and ``apache.rocketmq.v2`` package
(the gRPC method paths and the message names are the protocol's).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

#: The apache/rocketmq-apis commit the stubs were generated from (2026-07-30).
APIS_COMMIT = "3e60073c6dab3430feaec443824802e23ecda681"
#: The proto files the broker serves (``admin.proto``'s Admin service is not served).
PROTOS = ("apache/rocketmq/v2/definition.proto", "apache/rocketmq/v2/service.proto")
HERE = Path(__file__).resolve().parent
_IMPORT = re.compile(r"^from apache\.rocketmq\.v2 import ", re.MULTILINE)


def regenerate(apis: Path) -> list[Path]:
    """Run protoc over ``apis``'s protos and write the stubs here; returns the files written."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as out:
        args = ["protoc", f"-I{apis}", f"-I{include}", f"--python_out={out}", f"--pyi_out={out}",
                f"--grpc_python_out={out}", *PROTOS]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {apis}")
        written = []
        for src in sorted((Path(out) / "apache" / "rocketmq" / "v2").iterdir()):
            if src.name == "definition_pb2_grpc.py":  # no service in it
                continue
            text = _IMPORT.sub("from txbroker.remoting.grpc import ", src.read_text())
            dst = HERE / src.name
            dst.write_text(text)
            written.append(dst)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m txbroker.remoting.grpc.regenerate ROCKETMQ_APIS_DIR")
    for path in regenerate(Path(sys.argv[1])):
        print(path)
