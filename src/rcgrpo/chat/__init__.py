"""What the agent reads and writes: the prompt (system prompt, tool docs, reward goal, chat
template) and the trajectory record trained on. Imports: none."""
