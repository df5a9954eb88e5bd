"""The sentences each benchmark result is published as (:mod:`bench.figures`), by kind of
benchmark: each function takes one parsed ``bench/results/<name>.json`` and returns text made
only of the figures recorded there."""
