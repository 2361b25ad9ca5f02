"""Evaluation: held-out BFCL scoring with both checkers and Wilson intervals, bfcl-eval result files,
charts, comparison of runs, the paper's four variants.
Imports: bfcl, chat, data, fields, models, rollout."""
