"""What runs inside each emulated host: one process of a run.

``python -m traffic.runtime RUN_DIR PROC_NAME`` (see :mod:`.__main__`) joins the gloo
process group, builds a :class:`~.context.Context` and runs the scheme's role.

Modules:
    context    Context: spec, role, ranks by role, model, data, transport, events, comm
    events     EventLog: ``events/<proc>.jsonl``
    transport  Transport: logged torch.distributed point-to-point and collectives
    comm       CommThread / PriorityCommThread: background communication, futures
    trainer    Trainer: the standard loop with the scheme hooks; evaluate; make_optimizer
    buffers    Buffers: where large tensors live, the model's own or light memory's shared
               zeros and scratch (``workload.compute.memory``)

The loopback runner that starts every process of a run without Mininet is harness code:
:mod:`testbed.loopback`. This package's ``__init__`` imports nothing heavy.
"""
