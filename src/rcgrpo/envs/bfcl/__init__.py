"""BFCL v4 multi-turn as the run's environment: the prompt protocols over the sandboxed episodes
of rcgrpo.bfcl, the sandbox workers, the two checkers as named rewards, and the ground truth and
its perturbations for the data stage. Imports: bfcl, chat, rollout."""
