"""Presentation of finished runs: the self-contained HTML report (html.py + templates/), its plots
(plots.py) and the table that compares runs (comparison.py). Reads runs only through `Run.open`
(batch/run/rundir.py)."""
