"""The dataset stage: expert and failed trajectories, quality labels, Great Expectations validation,
and DVC versioning (publish, rollback).
Imports: bfcl, chat, config, fields, models, owned, rollout, runtime."""
