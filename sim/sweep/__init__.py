"""What-if studies: a grid of simulator runs described in a TOML file (SPEC §9).

- :mod:`~sim.sweep.study` -- the study file, its axes and metrics, the seed of a point;
- :mod:`~sim.sweep.runner` -- every point through :func:`sim.decode.simulate_decode`, in local processes
  or on an existing Dask cluster (``dask.distributed``), surviving lost workers;
- :mod:`~sim.sweep.table` -- the result, one row per point (CSV, or Parquet when ``pyarrow`` is
  installed), written as the points finish, that :mod:`sim.report` plots.

``engram sim sweep STUDY.toml`` runs one (:mod:`sim.cli`); ``--resume`` continues an unfinished one.
"""

from __future__ import annotations

from .runner import (MAX_ATTEMPTS, Context, PointRunner, SweepError, SweepResult, check_points, resolve_context,
                     resume_rows, run_points, run_study)
from .study import AXES, METRICS, PHASES_COLUMN, Study, check_point, point_phases, point_seed, point_trace
from .table import TableWriter, check_table_target, meta_path, partial_path, read_table, same_axis_value, write_table

__all__ = ["AXES", "MAX_ATTEMPTS", "METRICS", "PHASES_COLUMN", "Context", "PointRunner", "Study", "SweepError",
           "check_table_target",
           "SweepResult", "TableWriter", "check_point", "check_points", "meta_path", "partial_path", "point_phases",
           "point_seed", "point_trace", "read_table", "resolve_context", "resume_rows", "run_points", "run_study",
           "same_axis_value", "write_table"]
