"""Plotted reports: measurements, predictions and what-if studies as a folder of figures (SPEC §8, §9).

Data first, drawing last:

- :mod:`~sim.report.inputs` -- what a report is made from: a measurement folder and the traces;
- :mod:`~sim.report.whatif` -- every simulation the report runs, and the rows of its data tables;
- :mod:`~sim.report.plots` -- matplotlib (the one import of it in ``sim``) and the report folder;
- :mod:`~sim.report.document` -- the document, rendered as Markdown and HTML;
- :mod:`~sim.report.figures` -- the predicted figures, drawn from :mod:`~sim.report.whatif`'s data;
- :mod:`~sim.report.sections` -- predicted vs measured, sweep studies, the run, the inputs;
- :mod:`~sim.report.build` -- :func:`build_report`: the sections in order, the headline figures.
"""

from __future__ import annotations

from .build import build_report
from .document import Doc, anchor
from .inputs import WHATIF_TOKENS, Inputs, default_traces, device_label, load_inputs
from .plots import ReportFolder, pyplot
from .whatif import CACHE_ROWS, CAPACITY_SESSIONS, CAPACITY_TARGET, READERS, SIM_STEPS, THRESHOLDS, capacity_of

__all__ = ["CACHE_ROWS", "CAPACITY_SESSIONS", "CAPACITY_TARGET", "READERS", "SIM_STEPS", "THRESHOLDS",
           "WHATIF_TOKENS", "Doc", "Inputs", "ReportFolder", "anchor", "build_report", "capacity_of",
           "default_traces", "device_label", "load_inputs", "pyplot"]
