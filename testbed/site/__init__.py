"""Where a run's network and processes live: this machine (:class:`LocalSite`) or several
machines (:class:`ClusterSite`, for a spec with a ``cluster:`` section).

The site is chosen once, when the run starts (:func:`open_site`), and owns everything that
differs between one machine and several, so that the runner (:func:`testbed.runner._run`)
reads as the phases of a run whatever the site:

* the network: :meth:`Site.build` (Mininet, shaping read back) and its teardown;
* clocks: each machine's offset from this one (none on one machine);
* files: what the processes read (:meth:`Site.share`) and where a host's processes write
  (:meth:`Site.host_dir`, :meth:`Site.fetch`);
* processes: :meth:`Site.popen` (a planned process in its host), :meth:`Site.run_in` (any
  command in a host), :meth:`Site.kill`, :meth:`Site.listening`;
* capture: :meth:`Site.start_capture`, stopped at teardown, gathered into ``traces/``;
* events the processes write, followed while the run trains (:meth:`Site.follow_events`);
* link shaping during the run: :attr:`Site.shaper` (:mod:`testbed.shaping`).

Every start registers its undo on the run's teardown stack (an ``ExitStack``, unwound last
in first out), as Mininet's cluster support hides local and remote behind one node class.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from testbed import launch
from testbed.ledger import Ledger
from testbed.site.base import Site, log_leftovers, switch_ports, uplink_ports
from testbed.site.cluster import ClusterSite
from testbed.site.local import LocalSite
from testbed.spec import Experiment

__all__ = ["Site", "LocalSite", "ClusterSite", "open_site", "switch_ports", "uplink_ports", "log_leftovers"]


def open_site(
    exp: Experiment, run_dir: Path, ledger: Ledger, teardown: ExitStack, zygote: launch.Zygote | None = None
) -> Site:
    """The site of a run: a :class:`ClusterSite` when ``exp`` has a ``cluster`` section, else
    a :class:`LocalSite` (``zygote``: a live zygote of the caller's, used and left running)."""
    if exp.cluster is not None:
        return ClusterSite(exp, run_dir, ledger, teardown)
    return LocalSite(exp, run_dir, ledger, teardown, zygote=zygote)
