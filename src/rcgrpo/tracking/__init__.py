"""Tracking: MLflow runs (code, data and config versions), the Model Registry, and the run report.
The only stage that imports mlflow. Imports: chat, config, data, envs, evaluation, fields, models, owned, procs, rollout, run_config, runtime, training."""
