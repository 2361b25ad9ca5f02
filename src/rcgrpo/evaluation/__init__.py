"""Evaluation: held-out BFCL scoring with both checkers and Wilson intervals, bfcl-eval result files,
charts, comparison of runs, the paper's four variants. May import: training and every layer below."""
