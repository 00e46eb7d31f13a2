"""One-letter dimension glossary used in jaxtyping strings, docstrings and tests.

B  batch (requests in the decode batch)
S  speculative steps (draft depth, ``speculative_num_steps``)
K  top-k per draft step (``speculative_eagle_topk``)
N  draft tokens per request incl. the root (``speculative_num_draft_tokens``, verify width)
A  accept width = S + 1
C  candidate scores per request = K + (S - 1) * K * K
Q  parent-list width = K * (S - 1) + 1 (0 when S == 1)
V  vocab size
H  hidden size
L  layers
P  pages
G  page size (tokens per page)
M  max pages per request (page-table width)
W  max tokens per request (req_to_token width)
R  request-pool rows
T  flattened tokens
X  KV pool slots
F  KV row features (heads * head_dim)
"""
