"""The bench's work dir, read and written through Hadoop's FileSystem in the driver JVM.

A trace, its results and its report may live anywhere every machine of a Spark cluster reads:
``hdfs://nn/bench``, ``s3a://bucket/bench``, ``file:///mnt/shared/bench`` or a plain path.  The
Parquet data is read and written by Spark itself; the few small files only the driver needs
(the ``_txbroker_*.json`` metadata, ``verify.json``, the report) go through the same
FileSystem here, so nothing depends on the driver's local disk and ``hdfs://nn/x`` never meets
``os`` or ``shutil``.

A path without a scheme is qualified the way Hadoop qualifies it, against ``fs.defaultFS``
and its working directory (on a machine without Hadoop settings: ``file:`` and the current
directory of this process, not the JVM's), and the qualified URI is what executors are handed: never a relative path,
which each executor would resolve against its own working directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

#: A URI's scheme (two letters at least, so ``C:`` stays a path).
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


def has_scheme(target: str) -> bool:
    """``hdfs://…``, ``file:/…``: a URI, not a path."""
    return bool(_SCHEME.match(target))


def join(uri: str, *names: str) -> str:
    """``uri/name/...``: a child of a directory URI (names are single path components)."""
    return "/".join([uri.rstrip("/"), *names])


def local_path(uri: str) -> Path | None:
    """The local path of a ``file:`` URI, ``None`` for any other filesystem."""
    if not uri.startswith("file:"):
        return None
    rest = uri[len("file:"):]
    if rest.startswith("//"):
        authority, _, rest = rest[2:].partition("/")
        if authority not in ("", "localhost"):
            return None
        rest = "/" + rest
    return Path(rest)


class WorkFS:
    """The Hadoop FileSystem of a running SparkSession (the JVM's configuration, so
    ``spark.hadoop.*`` settings and ``core-site.xml`` apply as they do to Spark's own reads).

    Failures raise ``OSError`` (``FileNotFoundError`` for a missing file) whose ``filename``
    is the URI and whose ``strerror`` is Hadoop's one-line reason."""

    def __init__(self, spark) -> None:
        self._jvm = spark._jvm
        self._conf = spark._jsc.hadoopConfiguration()

    def _resolve(self, uri: str):
        path = self._jvm.org.apache.hadoop.fs.Path(uri)
        return self._call(uri, path.getFileSystem, self._conf), path

    def _call(self, uri: str, fn, *args):
        from py4j.protocol import Py4JJavaError

        try:
            return fn(*args)
        except Py4JJavaError as exc:
            java = exc.java_exception
            reason = str(java.getMessage() or java.getClass().getName())
            if java.getClass().getName() == "java.io.FileNotFoundException":
                raise FileNotFoundError(2, "no such file or directory", uri) from None
            if "ClassNotFoundException" in reason or "No FileSystem for scheme" in reason:
                reason = (f"no Hadoop FileSystem for this scheme on the driver ({reason}); "
                          "add its jars with --packages or spark.jars")
            raise OSError(None, reason, uri) from None

    def qualify(self, path: str | Path) -> str:
        """The absolute URI of ``path`` (a URI, or a path on the default filesystem)."""
        text = str(path)
        if not text:
            raise OSError(None, "empty path", text)
        if (not has_scheme(text) and not text.startswith("/")
                and str(self._conf.get("fs.defaultFS") or "file:").startswith("file:")):
            # The JVM's working directory is where it started; this process may have moved.
            text = os.path.abspath(text)
        fs, p = self._resolve(text)
        return str(self._call(text, fs.makeQualified, p).toString())

    def exists(self, uri: str) -> bool:
        fs, p = self._resolve(uri)
        return bool(self._call(uri, fs.exists, p))

    def names(self, uri: str) -> list[str]:
        """Names in directory ``uri`` (Hadoop's own ``.crc`` checksum files left out)."""
        fs, p = self._resolve(uri)
        return sorted(n for n in (str(st.getPath().getName())
                                  for st in self._call(uri, fs.listStatus, p))
                      if not (n.startswith(".") and n.endswith(".crc")))

    def delete(self, uri: str) -> None:
        """Remove ``uri`` and everything under it (nothing when it does not exist)."""
        fs, p = self._resolve(uri)
        self._call(uri, fs.delete, p, True)

    def replace_dir(self, uri: str, marker: str, what: str) -> None:
        """Make way for a new ``what`` at ``uri``: remove an old one (a directory holding
        ``marker``) or an empty directory; refuse anything else, which is not ours to delete."""
        if not self.exists(uri):
            return
        names = self.names(uri)
        if names and marker not in names:
            raise FileExistsError(17, f"exists and is not a {what} (no {marker}); "
                                      "refusing to overwrite it", uri)
        self.delete(uri)

    def read_bytes(self, uri: str) -> bytes:
        fs, p = self._resolve(uri)
        stream = self._call(uri, fs.open, p)
        try:
            return bytes(self._call(uri, self._jvm.org.apache.commons.io.IOUtils.toByteArray,
                                    stream))
        finally:
            stream.close()

    def write_bytes(self, uri: str, data: bytes) -> None:
        """Create or replace file ``uri`` with ``data`` (parent directories are created)."""
        fs, p = self._resolve(uri)
        out = self._call(uri, fs.create, p, True)
        try:
            self._call(uri, out.write, bytearray(data))
        finally:
            self._call(uri, out.close)

    def publish_text(self, uri: str, text: str) -> None:
        """Write the new file ``uri`` whole or not at all: written beside it, then renamed, so
        a reader (or a run resumed after the driver was killed mid-write) never finds it
        half-written.  ``uri`` must not exist yet."""
        staged = uri + ".partial"
        self.write_text(staged, text)
        fs, p = self._resolve(uri)
        if not self._call(uri, fs.rename, self._resolve(staged)[1], p):
            self.delete(staged)
            raise OSError(None, f"could not rename {staged} to it", uri)

    def read_text(self, uri: str) -> str:
        return self.read_bytes(uri).decode()

    def write_text(self, uri: str, text: str) -> None:
        self.write_bytes(uri, text.encode())
