"""The dataset stage: expert and failed trajectories, quality labels, Great Expectations validation,
and DVC versioning (publish, rollback). May import: rollout, models, chat, bfcl, runtime, config."""
