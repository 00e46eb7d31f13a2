"""The one letter glossary of jaxspec: jaxtyping strings, docstrings and test dimensions use these letters.

A trailing 1 means minus one (``N1 = N - 1``, ``S1 = S - 1``); juxtaposed letters multiply (``BN = B * N``).

Speculation (``SpecConfig``)
  S  speculative steps (draft depth, ``speculative_num_steps``)
  K  top-k per draft step (``speculative_eagle_topk``)
  N  draft tokens per request incl. the root (``speculative_num_draft_tokens``, verify width)
  A  accept width = S + 1
  C  scored candidates per request = K + (S - 1) * K * K
  J  parent-list width = K * (S - 1) + 1 (0 when S == 1)

Batches, tokens, vocabulary
  B  batch (requests / rows in one step)
  T  flattened tokens (a packed ragged axis)
  Q  fresh tokens per row in one model forward (``jaxspec.protocols``)
  U  uniform tokens per request of the paged location ops (``T = B * U``)
  V  vocab size

Caches and tables
  L  layers
  X  KV pool slots (slot = page * G + offset)
  R  request rows of a table (``req_to_token`` / ``req_to_page``)
  W  max tokens per request row (``req_to_token`` width)
  M  max pages per request row (``req_to_page`` width)
  P  pages per request row in a forward's page table (``jaxspec.protocols``)
  G  page size (tokens per page)
  D  KV row width in elements (heads * head dim, flattened)

Models
  H    hidden size
  Hkv  KV heads
  E    head dim
  F    width of the feature a target hands to its drafter
"""
