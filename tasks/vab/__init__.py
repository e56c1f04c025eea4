"""Visual Aesthetic Benchmark (issue 10): sets, trials, metrics, imports (docs/VAB.md).

Light modules (sets, release, trials, metrics, official, prompts, tables, imports, results_import):
pyarrow, numpy and Pillow only, no torch, Prefect or Great Expectations, so `imagebench vab
leaderboard` and `vab summarize` answer quickly. `official` is the authors' summarize.py math
(issue 17), `metrics` our stricter one.
"""
