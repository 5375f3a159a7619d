"""The simulator's compiled part: ``lean``, the fast decode loop as the build compiled it (``setup.py``, from
:mod:`sim.decode.lean_loop` and the device queue of :mod:`sim.device.fluid`), which :mod:`sim.decode.fast` runs
where its text is the text of now.  Absent where the extensions were not built: the same loop then runs as
Python."""
