"""eval/: measuring agents on the worlds (docs/guides/evaluation.md).

``contract`` is what a run records; ``runner`` runs the trials, ``metrics`` computes pass@k,
pass^k and the rest from them, ``report`` renders Markdown, HTML, CSV and parquet and
compares runs.
"""
