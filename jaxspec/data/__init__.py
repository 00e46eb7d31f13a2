"""Data: evaluation data fetched once into the user cache and hash-checked (``jaxspec.data.mtbench``: MT-Bench's
80 questions; nothing is written into the repository), jaxspec's own chat prompts (``chat_prompts``) and the
self-distillation data a draft head trains on (``self_distill``). Nothing here is imported by ``import jaxspec``."""
