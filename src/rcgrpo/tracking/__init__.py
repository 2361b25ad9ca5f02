"""Tracking: MLflow runs (code, data and config versions), the Model Registry, and the run report.
The only stage that imports mlflow. Imports: chat, data, evaluation, fields, runtime."""
