"""Policy models: profiles and budgets, building and loading weights, reward tokens, LoRA, export
for serving. The one place transformers and peft load a model.
Imports: bfcl, chat, fields, owned, runtime."""
