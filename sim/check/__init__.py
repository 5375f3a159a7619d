"""The model held against the engine: calibration from measured documents
(:mod:`~sim.check.calibrate`, per-run windows :mod:`~sim.check.windows`), prediction intervals
(:mod:`~sim.check.intervals`), the machine's regime and its goals (:mod:`~sim.check.regimes`),
the cross-check of predicted against measured runs (:mod:`~sim.check.crosscheck`) and its planner
mode, predicting from a fio file or a datasheet only (:mod:`~sim.check.planner`)."""
