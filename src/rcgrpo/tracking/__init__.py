"""Tracking: MLflow runs (code, data and config versions), the Model Registry, and the run report.
The only stage that imports mlflow. Imports: bfcl, chat, config, data, evaluation, fields, models, owned, procs, rollout, run_config, runtime, training."""
