"""Visual Aesthetic Benchmark (issue 10): sets, trials, metrics, imports (docs/VAB.md).

Light modules (sets, trials, metrics, tables, imports): pyarrow, numpy and Pillow only, no torch,
Prefect or Great Expectations, so `imagebench vab leaderboard` answers quickly.
"""
