"""Chakra's protobuf files, read and written with mlc-chakra's own classes.

A Chakra execution trace file (``.et``) is a stream of length-prefixed protobuf messages: one
``GlobalMetadata``, then ``Node`` after ``Node`` (``chakra.schema.protobuf.et_def_pb2``),
each framed by ``encodeMessage``/``decodeMessage`` of
``chakra.src.third_party.utils.protolib``. mlc-chakra is an optional dependency (the extra
``chakra``: ``pip install -e '.[chakra]'``, which ``scripts/setup.sh`` installs); it is imported
on first use, so that importing this package, and every scheme, stays light.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from common.errors import MissingRequirement, TestbedError

__all__ = ["TraceFileError", "et_def", "read_trace_file", "write_trace_file", "attr_value"]


class TraceFileError(TestbedError):
    """A trace file that is missing, unreadable, truncated or not Chakra's format; the message
    names the file (and the node, when one is at fault)."""


def _chakra():
    """``(et_def_pb2, protolib)`` of mlc-chakra.

    Raises:
        MissingRequirement: mlc-chakra (or protobuf) is not installed.
    """
    try:
        from chakra.schema.protobuf import et_def_pb2  # lazy: optional dependency (extra 'chakra')
        from chakra.src.third_party.utils import protolib  # lazy: optional dependency (extra 'chakra')
    except ImportError as e:
        raise MissingRequirement(
            f"Chakra traces need mlc-chakra ({e}): install the extra 'chakra' "
            f"(.venv/bin/pip install -e '.[chakra]', or run scripts/setup.sh)"
        ) from None
    return et_def_pb2, protolib


def et_def() -> ModuleType:
    """mlc-chakra's ``et_def_pb2`` module (the ``Node``, ``GlobalMetadata``, ``AttributeProto``
    classes and the ``NodeType``/``CollectiveCommType`` enums).

    Raises:
        MissingRequirement: mlc-chakra is not installed.
    """
    return _chakra()[0]


class _Reads(io.BytesIO):
    """A file in memory that remembers the first read which got fewer bytes than it asked for."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self.short_at: int | None = None

    def read(self, n: int = -1) -> bytes:
        at = self.tell()
        out = super().read(n)
        if n is not None and n > 0 and len(out) < n and self.short_at is None:
            self.short_at = at
        return out


def read_trace_file(path: str | Path):
    """The metadata and nodes of one ``.et`` file.

    Returns:
        ``(GlobalMetadata, [Node, ...])`` in file order.

    Raises:
        TraceFileError: the file is missing or unreadable, empty, ends inside a message
            (truncated: the message names the last node read whole), or holds bytes that do not
            parse as Chakra's messages (malformed: the byte offset).
        MissingRequirement: mlc-chakra is not installed.
    """
    pb, protolib = _chakra()
    from google.protobuf.message import DecodeError  # lazy: protobuf comes with the extra 'chakra'

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TraceFileError(f"{path}: cannot read the trace file ({e.strerror or e})") from None
    if not data:
        raise TraceFileError(f"{path}: empty file; a Chakra trace starts with its GlobalMetadata message")
    f = _Reads(data)
    nodes = []

    def where() -> str:
        return f"after node {_label(nodes[-1])}" if nodes else "in its GlobalMetadata message"

    meta = pb.GlobalMetadata()
    msg = meta
    while True:
        start = f.tell()
        try:
            got = protolib.decodeMessage(f, msg)
        except (DecodeError, ValueError, RuntimeError) as e:
            if f.short_at is not None:
                raise TraceFileError(
                    f"{path}: truncated: the file ends inside the message at byte {start}, "
                    f"{where()} ({len(data)} bytes)"
                ) from None
            raise TraceFileError(
                f"{path}: malformed at byte {start} {where()} (not a Chakra {type(msg).__name__} message: {e})"
            ) from None
        if f.short_at is not None and not (not got and f.short_at == start == len(data)):
            raise TraceFileError(
                f"{path}: truncated: the file ends inside the message at byte {start}, {where()} ({len(data)} bytes)"
            )
        if not got:
            if start != len(data):
                raise TraceFileError(
                    f"{path}: malformed at byte {start} {where()}: an empty or unreadable "
                    f"message before the end of the file ({len(data)} bytes)"
                )
            break
        if msg is not meta:
            nodes.append(msg)
        msg = pb.Node()
    return meta, nodes


def write_trace_file(path: str | Path, metadata, nodes: Iterable) -> Path:
    """Write ``metadata`` (a ``GlobalMetadata``) then each ``Node`` to ``path`` (created; an
    existing file is an error), framed as Chakra's tools read them.

    Raises:
        FileExistsError: ``path`` exists.
        MissingRequirement: mlc-chakra is not installed.
    """
    _, protolib = _chakra()
    path = Path(path)
    with open(path, "xb") as f:
        protolib.encodeMessage(f, metadata)
        for n in nodes:
            protolib.encodeMessage(f, n)
    return path


def attr_value(attr):
    """The value of one ``AttributeProto`` (a number, string, bool, bytes, or a list for the
    ``*_list`` kinds); None when it holds none."""
    which = attr.WhichOneof("value")
    if which is None:
        return None
    v = getattr(attr, which)
    return list(v.values) if which.endswith("_list") else v


def _label(node) -> str:
    return f"{node.id} ({node.name!r})" if node.name else str(node.id)
