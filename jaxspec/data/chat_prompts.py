"""A few short chat prompts written for jaxspec (none is from MT-Bench, HumanEval or GSM8K): what
``python -m jaxspec.demo`` decodes, and the benchmarks that measure a draft head on chat replies.

Each renders to 41-46 tokens through SmolLM2's chat template (its default system turn included), so they share
one prefill bucket.
"""

CHAT_PROMPTS = (
    "Give me three short tips for keeping houseplants alive in a dark flat.",
    "Write a friendly note inviting my neighbours to a garden party on Saturday.",
    "In two sentences, what does a bicycle's gear system do when riding uphill?",
    "Suggest a simple vegetarian dinner I can cook in twenty minutes.",
    "Why do cats purr? Keep the answer short.",
)
