"""Chakra execution traces (MLCommons) in and out.

* :mod:`traffic.chakra.proto`: the ``.et`` files, read and written with mlc-chakra's own
  protobuf classes (an optional dependency, imported on first use);
* :mod:`traffic.chakra.trace`: a trace read, checked and put in replay order
  (:func:`~traffic.chakra.trace.load_trace`), which the scheme ``trace``
  (:mod:`traffic.schemes.trace`) replays on the emulated network;
* :mod:`traffic.chakra.export`: one trace per rank from a run directory's events
  (``testbed export chakra``).
"""

from traffic.chakra.proto import TraceFileError
from traffic.chakra.trace import COLLECTIVES, Op, RankTrace, Trace, load_trace, trace_files

__all__ = ["TraceFileError", "COLLECTIVES", "Op", "RankTrace", "Trace", "load_trace", "trace_files"]
