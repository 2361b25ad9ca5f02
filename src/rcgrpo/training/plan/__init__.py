"""`rcgrpo plan`: will a config fit the GPUs, and how long will a step take, before any set-up.

constants.py (every number not in the config, with its source), calibration.py (the assumed
ones, or a GPU's measurements in their place: `--calibration`), memory.py (what one GPU holds,
term by term), timing.py (the RL step's rollouts simulated lock-step and async on a decode cost
model; the update from FLOPs at a stated MFU), flops.py (those FLOPs), report.py (the plan of a config, its check and
its text), episodes.json (the shapes of the 800 replayed ground truths,
scripts/episode_shapes.py). Part of the training layer; it forms micro-batches as
rcgrpo.training.batching does, and never imports a heavy library (the command takes seconds).
Imports: config, models, rollout, training.

    rcgrpo plan --profile qwen2.5-7b-instruct --preset paper --gpus 8 --gpu-memory 80
    .venv/bin/pytest tests/test_plan.py -q
"""
