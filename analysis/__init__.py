"""Run directories -> pandas frames -> metrics, plots and timelines.

import analysis
run = analysis.load("runs/quickstart-20250101-120000")
run.rates            # per switch port tx/rx bits/s over time
analysis.metrics.summarize(run.path)   # iterations.csv + summary.json
analysis.flows(run.path)   # TCP flows of a packet capture (capture.pcap), see analysis/flows/
"""

from analysis.flows import flows
from analysis.load import Run, load

__all__ = ["Run", "load", "flows"]
