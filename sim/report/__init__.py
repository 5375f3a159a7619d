"""Plotted reports: measurements, predictions and what-if studies as a folder of figures (SPEC §8, §9).

Data first, drawing last:

- :mod:`~sim.report.inputs` -- what a report is made from: a measurement folder and the traces;
- :mod:`~sim.report.whatif` -- every simulation the report runs (its capacity search too), and the rows of
  its data tables;
- :mod:`~sim.report.plots` -- matplotlib (the one import of it in ``sim``) and the report folder;
- :mod:`~sim.report.document` -- the document, rendered as Markdown and, by markdown-it-py, as HTML;
- :mod:`~sim.report.answer` -- the answer the report leads with: capacity per device, with assumptions and
  the band over seeds;
- :mod:`~sim.report.figures` -- the predicted figures, drawn from :mod:`~sim.report.whatif`'s data;
- :mod:`~sim.report.sections` -- predicted vs measured, sweep and capacity studies, the run, the inputs;
- :mod:`~sim.report.build` -- :func:`build_report` (settings: :class:`ReportSearch`, :class:`ReportPage`):
  the answer, then the evidence, in order.
"""

from __future__ import annotations

from sim.sweep.capacity import CAPACITY_TARGET, capacity_of
from .build import ReportPage, ReportSearch, build_report, regime
from .document import Doc, anchor, render_html
from .inputs import WHATIF_TOKENS, Inputs, default_traces, device_label, load_inputs
from .plots import ReportFolder, pyplot
from .whatif import CACHE_ROWS, READERS, REPORT_MAX_SESSIONS, REPORT_SEEDS, SIM_STEPS, THRESHOLDS

__all__ = ["CACHE_ROWS", "CAPACITY_TARGET", "READERS", "REPORT_MAX_SESSIONS", "REPORT_SEEDS", "SIM_STEPS",
           "THRESHOLDS", "WHATIF_TOKENS", "Doc", "Inputs", "ReportFolder", "ReportPage", "ReportSearch", "anchor", "build_report", "capacity_of",
           "default_traces", "device_label", "load_inputs", "pyplot", "regime", "render_html"]
