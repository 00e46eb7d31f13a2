"""Evaluation data fetched once into the user cache and hash-checked (``jaxspec.data.mtbench``: MT-Bench's 80
questions). Nothing here is imported by ``import jaxspec``; nothing is written into the repository."""
