"""BFCL v4 multi-turn: tasks and split, episodes on the real API classes, the safe call executor,
the tool sandbox and both checkers. Imports: config."""
