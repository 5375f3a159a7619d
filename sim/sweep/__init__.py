"""What-if studies: a grid of simulator runs described in a TOML file (SPEC §9).

- :mod:`~sim.sweep.study` -- the study file, its axes and metrics, the seed of a point;
- :mod:`~sim.sweep.runner` -- every point through :func:`sim.decode.simulate_decode`, in local processes
  or on an existing Dask cluster (``dask.distributed``);
- :mod:`~sim.sweep.table` -- the result, one row per point (CSV, or Parquet when ``pyarrow`` is
  installed), that :mod:`sim.report` plots.

``engram sim sweep STUDY.toml`` runs one (:mod:`sim.cli`).
"""

from __future__ import annotations

from .runner import SweepResult, run_points, run_study
from .study import AXES, METRICS, Study, check_point, point_seed
from .table import read_table, write_table

__all__ = ["AXES", "METRICS", "Study", "SweepResult", "check_point", "point_seed", "read_table", "run_points",
           "run_study", "write_table"]
