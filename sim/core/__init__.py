"""The simulator's vocabulary, below every model: the read policy, compute and phases of a run
(:mod:`~sim.core.params`), the documents' schemas (:mod:`~sim.core.schema`), files and packaged
data (:mod:`~sim.core.io`), the machine's limits (:mod:`~sim.core.limits`) and progress lines
(:mod:`~sim.core.progress`)."""
