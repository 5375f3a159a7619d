"""The cross-check's prediction interval: how far a run's measured tokens/s may lie from its prediction.

Prediction interval: what separates a run's measured tokens/s from its
prediction, besides the model, is the window's uncertainty
(:func:`sim.check.windows.window_state`): the probes' mean read and compute are
estimates (``read_se``, ``compute_se``; they move the prediction by the
share of a step they make up), the run's own mean over its ``n`` trace steps
varies (``step_cv / sqrt(n)``), and the simulator's own estimate has its
sampling error.  A window's noise is taken as at least the median of its
configuration's windows over all rounds (:func:`sim.check.windows.window_noise`):
a short window that missed the machine's rare stalls looks steadier than it
was.  The model itself errs too, and how much shows on the other
configurations of the same cross-check: :func:`model_sd` is the robust scale
of their runs' errors around their median beyond their windows'
uncertainty, taken from every other configuration of the row's kind (single
or several sessions; leave-one-out, so a row's own error never widens its own
interval).  On a loaded machine it grows with the scatter the load causes; on
a quiet one it is near zero; a bias shared by all configurations does not
widen it (it shows as configurations outside their intervals).  Each run's prediction is taken as log-normal with the window's
variance plus the model's: its 90% interval is ``prediction * exp(+-1.645
sd)`` (``runs_inside`` counts the runs inside their own).  A configuration is
checked run by run, as its error is taken: it is inside when the median over
its runs of ``log(measured / predicted)`` lies within ``+-1.645`` times the
median of their ``sd`` (``error_low``, ``error_high``: that band on the
error).  It does not narrow with the repeats, because part of a run's
deviation is common to every repeat of a configuration (the simulator's own
shape).  Comparing the median of the measured runs with an interval around
the median of the predictions would not do on a loaded machine: the repeats
spread by tens of percent and the two medians are often different runs (on a
run with others at 72% of the CPUs, 23 configurations: 23 inside run by run,
18 by the medians).  For plots the configuration's interval in tokens/s is
the median of its runs' bounds (``low``, ``high``; ``slowest_low``,
``slowest_high``); the interval the median would have if the runs were
independent (90% of the median over runs of log-normal draws,
:data:`INTERVAL_DRAWS` of them, seeded) is kept beside it
(``independent_low``, ``independent_high``).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .calibrate import Calibration
from sim.core.schema import RunConfig
from .windows import window_noise

__all__ = ["INTERVAL_DRAWS", "INTERVAL_Z", "MODEL_PEERS_MIN", "MODEL_RUNS_MIN", "error_band", "median_interval",
           "model_sd", "peer_model_sd", "run_interval", "run_sd"]

#: Standard normal quantile of the two-sided 90% prediction interval.
INTERVAL_Z = 1.645
#: Draws of the median over a configuration's runs behind its interval.
INTERVAL_DRAWS = 4000
#: Runs of other configurations a model error needs at least (fewer: taken as 0).
MODEL_RUNS_MIN = 6
#: Other configurations of a row's own kind (single or several sessions) its model error is taken from at least
#: (fewer: from every other configuration).
MODEL_PEERS_MIN = 4


def run_sd(cal: Calibration, config: RunConfig, run: Mapping, pred: Mapping, slowest: bool = False) -> float:
    """The standard deviation of ``log(measured / predicted)`` tokens/s of one run that its window's
    uncertainty explains (see the module docstring; the noise is :func:`sim.check.windows.window_noise`'s, at least
    its configuration's); ``slowest``: of its slowest session (the steps of one session, not of all).  A run
    whose window was not probed: the simulation's own error alone."""
    if cal.window(run.get("window")) is None:
        return float(pred.get("sim_se", 0.0))
    w = window_noise(cal.windows, run["window"])
    n = config.steps * (1 if slowest else config.sessions)
    var = (pred["read_share"] * w["read_se"]) ** 2 + (pred["compute_share"] * w["compute_se"]) ** 2 \
        + w["step_cv"] ** 2 / max(n, 1) + float(pred.get("sim_se", 0.0)) ** 2
    return float(np.sqrt(var))


def median_interval(centers: Sequence[float], sds: Sequence[float], seed: int = 0,
                    level: float = 0.90, draws: int = INTERVAL_DRAWS) -> tuple:
    """``(low, high)``: the central ``level`` interval of the median over runs of log-normal draws, run ``r``'s
    centred on ``centers[r]`` with log standard deviation ``sds[r]`` (seeded)."""
    c = np.log(np.asarray(centers, dtype=np.float64))
    sd = np.asarray(sds, dtype=np.float64)
    z = np.random.default_rng([seed, 15]).standard_normal((int(draws), c.size))
    med = np.median(c + z * sd, axis=1)
    a = (1 - level) / 2
    return float(np.exp(np.quantile(med, a))), float(np.exp(np.quantile(med, 1 - a)))


def model_sd(errors: Sequence[float], sds: Sequence[float]) -> float:
    """The model's own scatter beyond the windows' uncertainty, from other configurations' runs.

    ``errors``: log(measured / predicted) tokens/s of the runs; ``sds``: each run's
    :func:`run_sd`.  The robust scale of the errors around their median
    (``1.4826 * median |error - median error|``: a normal's standard deviation, a
    few wild runs not counted) squared, less the median run's window variance,
    floored at zero::

        sqrt(max(0, (1.4826 * MAD(e))^2 - median(sd^2)))

    Around the median, not zero: a bias shared by every configuration is an
    error the intervals must show (it moves every configuration out of its
    interval together), not a width that would hold it.  0 with fewer than
    :data:`MODEL_RUNS_MIN` runs (no evidence either way).
    """
    e = np.asarray(errors, dtype=np.float64)
    if e.size < MODEL_RUNS_MIN:
        return 0.0
    sd = np.asarray(sds, dtype=np.float64)
    mad = float(np.median(np.abs(e - np.median(e))))
    return float(np.sqrt(max(0.0, (1.4826 * mad) ** 2 - float(np.median(sd ** 2)))))


def peer_model_sd(fits: Sequence[tuple], i: int) -> float:
    """:func:`model_sd` of configuration ``i`` from the runs of every other configuration of its kind (single
    or several sessions) when there are :data:`MODEL_PEERS_MIN` of them, else of every other configuration:
    leave-one-out, so a configuration's own error never widens its own interval.  ``fits[j]``: ``(several
    sessions?, log errors of its runs, their window sds, ...)``; the result is a log standard deviation."""
    multi = fits[i][0]
    same = [j for j in range(len(fits)) if j != i and fits[j][0] == multi]
    peers = same if len(same) >= MODEL_PEERS_MIN else [j for j in range(len(fits)) if j != i]
    errors = [x for j in peers for x in fits[j][1]]
    sds = [x for j in peers for x in fits[j][2]]
    return model_sd(errors, sds)


def run_interval(c: RunConfig, mid: Sequence[Mapping], measured: Sequence[float], sd: np.ndarray,
              sd_slow: np.ndarray, msd: float, seed: int) -> tuple:
    """``(interval, inside, runs inside theirs)``: the configuration's 90% interval (the median of its runs' bounds;
    and of the slowest session's) and its band on the error (``error_low``, ``error_high``: ``exp(-+1.645 *
    median sd) - 1``), each run's log standard deviation its window's (``sd``, ``sd_slow``) and the model's
    (``msd``) combined; ``inside``: the median over runs of ``log(measured / predicted)`` lies within the band
    (run by run, as the error is taken); and how many runs' measured tokens/s lie inside their own run's
    interval."""
    tot = np.sqrt(sd ** 2 + msd ** 2)
    tot_slow = np.sqrt(sd_slow ** 2 + msd ** 2)
    pred = np.array([x["tokens_per_s"] for x in mid])
    slow = np.array([x["slowest_tokens_per_s"] for x in mid])

    def bound(x: np.ndarray, s: np.ndarray, sign: float) -> float:
        return float(np.median(x * np.exp(sign * INTERVAL_Z * s)))

    i_low, i_high = median_interval(pred, tot, seed)
    logs = np.log(np.asarray(measured) / pred)
    band = INTERVAL_Z * float(np.median(tot))
    inside = bool(abs(float(np.median(logs))) <= band)
    runs_inside = int(np.sum(np.abs(logs) <= INTERVAL_Z * tot))
    return ({"low": bound(pred, tot, -1), "high": bound(pred, tot, 1), "slowest_low": bound(slow, tot_slow, -1),
             "slowest_high": bound(slow, tot_slow, 1), "error_low": float(np.expm1(-band)),
             "error_high": float(np.expm1(band)), "independent_low": i_low, "independent_high": i_high,
             "z": INTERVAL_Z, "run_sd": tot.tolist(), "window_sd": sd.tolist(), "model_sd": msd}, inside, runs_inside)


def error_band(iv: Mapping) -> str:
    """A configuration's 90% band on its error, as shown everywhere: ``"[-8.1%, +8.8%]"`` (``"[-]"`` without)."""
    if "error_low" not in iv:
        return "[-]"
    return f"[{iv['error_low'] * 100:+.1f}%, {iv['error_high'] * 100:+.1f}%]"
