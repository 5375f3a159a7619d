"""The serving what-if: requests arriving, prompts prefilled, tokens decoded in continuous batches, latency
targets -- how many users one SSD can carry (issue 16).

- :mod:`~sim.serve.workload` -- open-loop arrivals (Poisson, gamma, replayed), prompt and output lengths;
- :mod:`~sim.serve.rows` -- the rows each request reads: prompt chunks, decode tokens, deduplicated per step;
- :mod:`~sim.serve.compute` -- the compute of an engine step by batch size and prompt tokens (default, fitted);
- :mod:`~sim.serve.device` -- whole batches of reads sharing a device, one event per batch;
- :mod:`~sim.serve.engine` -- the continuous-batching engine and its scheduler;
- :mod:`~sim.serve.metrics` -- TTFT, TBT, TPOT, goodput under SLOs, the device, Little's law;
- :mod:`~sim.serve.model` -- :func:`simulate_serve`, one configuration end to end;
- :mod:`~sim.serve.study` -- serving studies (TOML: ``[serve]``, ``[grid]``, ``[slo]``, ``[search]``);
- :mod:`~sim.serve.runner` -- serving points in local processes or on a Dask cluster;
- :mod:`~sim.serve.search` -- the capacity: the most requests/s meeting the SLOs, with a seed ensemble.
"""

from __future__ import annotations

from .compute import StepCompute
from .engine import Scheduler
from .metrics import SLO, ServeResult
from .model import ServeRun, ServeText, simulate_serve
from .rows import RowSource
from .search import ServeCapacity, find_serve_capacity, knee_cause, run_serve_capacity
from .study import RateSearch, ServeStudy
from .workload import Lengths, Requests, Workload, make_requests, read_request_file

__all__ = ["SLO", "Lengths", "RateSearch", "Requests", "RowSource", "Scheduler", "ServeCapacity", "ServeResult",
           "ServeRun", "ServeStudy", "ServeText", "StepCompute", "Workload", "find_serve_capacity", "knee_cause",
           "make_requests", "read_request_file", "run_serve_capacity", "simulate_serve"]
