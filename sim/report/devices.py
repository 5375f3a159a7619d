"""The report's section on the devices made on the machine: planner-mode errors per device beside today's.

It draws ``planner.json`` (:mod:`sim.check.planner`: every device's runs predicted from its fio JSON and from a
datasheet string only) and each device's own cross-check (the calibrated device and compute in each run's
window), and never simulates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional

from sim.check.planner import after_notes, datasheet_notes, host_notes

from .document import Doc
from .inputs import Inputs

__all__ = ["devices_section"]


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _figures(m: Optional[Mapping]) -> tuple:
    """``(median |error|, max |error|, capacity measured / predicted, regime)`` of one mode's result."""
    if not m:
        return "-", "-", "-", "-"
    if m.get("refused"):
        return "refused", m["refused"][:80], "-", "-"
    s = m.get("summary") or {}
    t = s.get("tokens_per_s") or {}
    caps = "; ".join(f"{c['mode']} {'>= ' if c['all_met']['measured'] else ''}{c['measured_capacity']} / "
                     f"{'>= ' if c['all_met']['predicted'] else ''}{c['predicted_capacity']}"
                     + ("" if c["within_one_step"] else " (not within one step)") for c in m.get("capacity") or [])
    targets = sorted({c.get("target_tokens_per_s") for c in m.get("capacity") or []} - {None})
    if caps and targets:
        caps += f" (at {', '.join(f'{t:g}' for t in targets)} tokens/s)"
    return (_pct(t.get("median_abs_error")), _pct(t.get("max_abs_error")), caps or "-",
            (s.get("regime") or {}).get("name", "-"))


def devices_section(doc: Doc, inp: Inputs) -> None:
    """Planner mode per device (a row per device and description), the per-class figures, and which devices
    were built or skipped; nothing when the folder has no ``planner.json``."""
    res = inp.planner
    if not res:
        return
    doc.h(1, "Planner mode on devices made here")
    doc.p("Each device the measurement made (the disk, read-IOPS throttles of it in a cgroup, a copy of the model "
          "on tmpfs) ran the same grid; here its runs are predicted the way a capacity planner would, from the "
          "device's fio JSON at the engine's read size and from a datasheet string derived from it, with no "
          "microbenchmark of the engine and no probe steps (`engram crosscheck --planner`), next to today's "
          "cross-check of the same runs (the calibrated device and compute in each run's own window). Errors "
          "are tokens/s, run by run, the median and the largest over the device's configurations; capacity is "
          "measured / predicted sessions whose slowest one reaches the target.")
    rows = []
    for e in res.get("devices") or []:
        if not e.get("built"):
            continue
        modes = e.get("modes") or {}
        for label, m, what in (("today (windows)", e.get("today"), "calibration + probe windows"),
                               ("fio", modes.get("fio"), Path(e.get("fio_file") or "-").name),
                               ("datasheet", modes.get("datasheet"), e.get("datasheet_used") or "-")):
            med, mx, caps, rg = _figures(m)
            rows.append([e["name"], e.get("class", "-"), label, f"`{what}`", med, mx, caps, rg])
    doc.table(["device", "class", "predicted from", "description", "tokens/s median abs error", "max",
               "capacity measured / predicted", "regime"], rows)
    cls_rows = [[cls, mode, ", ".join(c.get("devices") or []), c.get("configurations", 0),
                 _pct(c.get("median_abs_error")), _pct(c.get("max_abs_error"))]
                for cls, modes in (res.get("classes") or {}).items() for mode, c in modes.items()]
    if cls_rows:
        doc.table(["device class", "predicted from", "devices", "configurations", "median abs error", "max"],
                  cls_rows)
    notes = ["Devices built: " + (", ".join(res.get("built") or []) or "none") + "."]
    notes += [f"Skipped {n}: {why}." for n, why in (res.get("skipped") or {}).items()]
    notes += [f"{e['name']}: {e['datasheet_fallback']}." for e in res.get("devices") or [] if e.get("datasheet_fallback")]
    notes += [" ".join(line.split()) for e in res.get("devices") or [] if e.get("built") for line in
              datasheet_notes(e) + host_notes(e) + after_notes(e)]
    doc.ul(notes)
