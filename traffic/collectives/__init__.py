"""Collectives written over point-to-point transfers (:class:`~traffic.runtime.transport.Transport`).

torch.distributed's own collectives (gloo) are opaque: a scheme cannot compress inside them,
change their round structure, or see their steps in the events log. The algorithms here are
the ones the papers describe, step by step, each in its own module.
"""
