"""Topic seeds for self-synthesized chat prompts: the opening words of a user turn, in the kinds of request a
chat model is asked, for the target to continue into a whole request (``jaxspec.data.seeded_chat``).

Eight kinds (``CATEGORIES``): writing, roleplay, reasoning, math, coding, extraction, STEM and humanities. Each
holds groups of request stems (``{t}``: where a topic goes) and topics that read right together; a seed is one
stem with one topic of its group, drawn by ``seed_text(seed, i)`` (1,218 distinct openings). A stem that ends in
a colon or an open phrase asks the target to write the rest (the passage to summarize, the details of the
scene), so prompts vary in length as well as in kind. Every stem and topic was written for jaxspec; none is
taken from MT-Bench, HumanEval or GSM8K (``eval_overlap`` checks the generated prompts against an evaluation
set's questions). Licence: the project's."""

import gzip
import json
import re

import numpy as np

# kind -> groups of (stems, topics): every stem of a group reads right with every topic of the group
CATEGORIES: dict[str, tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]] = {
    "writing": ((
        ("Write a short story about {t}", "Write a poem about {t}", "Write a haiku about {t}.",
         "Write a blog post about {t}", "Write a letter to a friend about {t}", "Write a limerick about {t}",
         "Write a speech for a school assembly about {t}", "Give me a catchy title and an opening line for a story "
         "about {t}", "Write a diary entry about {t}", "Describe {t} in vivid detail"),
        ("a lighthouse keeper", "the first snow of winter", "a lost umbrella", "a robot learning to paint",
         "a small bakery", "an old map", "moving to a new city", "a rainy afternoon", "a forgotten garden",
         "a night train", "a stubborn goat", "a village festival", "learning to swim as an adult", "a broken clock",
         "the sound of the sea", "a kite on a windy day", "a friendly ghost", "an autumn market", "a chess club",
         "a family recipe", "the last day of summer", "a street musician", "a tiny island", "a first job")), (
        ("Write a product description for {t}", "Write a persuasive paragraph about why people should buy {t}",
         "Draft a short newsletter announcement about {t}", "Write a five-star review of {t}",
         "Write a slogan and a short advert for {t}"),
        ("reusable water bottles", "a pair of hiking boots", "a solar-powered lamp", "a folding bicycle",
         "a community library card", "a weekly vegetable box", "noise-cancelling headphones", "a pottery class",
         "a standing desk", "a board game cafe")), (
        ("Rewrite this sentence so it sounds more formal:", "Make this paragraph shorter and clearer:",
         "Correct the grammar in this text:", "Turn these notes into a polite email:"),
        ("",)),
    ),
    "roleplay": ((
        ("Pretend you are {t}. Introduce yourself", "Imagine you are {t} and describe your typical day",
         "You are {t}. A customer asks you for advice", "Act as {t} and answer my questions. First question:",
         "Role-play as {t} giving a short motivational talk", "Stay in character as {t}. What do you think of",
         "Play the role of {t} explaining your job to a child", "As {t}, write a diary entry about"),
        ("a pirate captain", "a medieval blacksmith", "a friendly librarian", "a tour guide in Rome",
         "a detective in the 1920s", "a space station engineer", "a grumpy cat", "a personal fitness coach",
         "a barista", "a wizard's apprentice", "a zookeeper", "a mountain rescue volunteer", "a famous chef",
         "a museum curator", "a ship's cook", "an ancient philosopher", "a startup founder", "a park ranger",
         "a time traveller from the year 3000", "a flight attendant", "a beekeeper", "a retired astronaut")),
    ),
    "reasoning": ((
        ("If {t}, what would happen next? Explain your reasoning", "Suppose {t}. Who would gain and who would lose?",
         "What are the hidden assumptions in the claim that {t} would be good for everyone?",
         "Give three arguments for and three against a world where {t}"),
        ("we stopped using cash", "cities banned cars on Sundays", "everyone worked four days a week",
         "schools started an hour later", "the internet went down for a week", "libraries lent tools as well as books",
         "trains were free for everyone", "homework was banned")), (
        ("Is it a good idea to {t}? Give pros and cons", "Explain step by step how you would decide whether to {t}",
         "Compare two ways to {t} and say which is better", "How could someone {t} on a small budget?",
         "Make a plan to {t} in one month"),
        ("learn a language in three months", "move a piano up three floors", "plan a trip with four friends",
         "buy a used car", "adopt a second dog", "rent instead of buying a house", "start a vegetable garden",
         "switch to an electric bike", "organise a charity run", "repair an old bicycle", "change careers at forty")), (
        ("Solve this riddle:", "Give me a logic puzzle and its answer.", "What is wrong with this argument:",
         "Which is heavier, and why:", "Find the pattern and the next item:"),
        ("",)),
    ),
    "math": ((
        ("Solve for x: {t}", "Check my answer to {t}", "Explain each step of solving {t}"),
        ("3x + 7 = 22", "x^2 - 5x + 6 = 0", "2(x - 4) = 3x + 1", "x / 3 + 2 = 9", "5x - 2 = 3x + 10",
         "x^2 = 49", "4x + 1 = 2x - 7")), (
        ("What is the derivative of {t}?", "What is the integral of {t}?", "Sketch the graph of {t} in words",
         "Where is {t} increasing?"),
        ("sin(x) * x^2", "e^(2x)", "ln(x) / x", "x^3 - 3x", "1 / (1 + x^2)", "cos(3x)", "x * e^x")), (
        ("Explain how to compute {t}", "Compute {t} and show your working", "What is {t}?"),
        ("the average of 4, 9, 15 and 20", "15% of 240", "the least common multiple of 12 and 18",
         "the area of a circle with radius 7 cm", "the area of a triangle with base 10 and height 6",
         "0.375 as a fraction", "120 km/h in metres per second", "the sum of the first 50 odd numbers",
         "the volume of a cube with side 4", "the median of 3, 8, 1, 9 and 4")), (
        ("What is the probability of {t}?", "Explain how to find the probability of {t}"),
        ("rolling two sixes with two dice", "drawing two red cards from a deck", "three heads in four coin tosses",
         "picking a vowel from the alphabet")), (
        ("Explain what {t} means with an example", "Why is {t} useful?", "Give me a practice problem about {t}"),
        ("a standard deviation", "a geometric series", "a matrix determinant", "a prime number", "a logarithm",
         "a vector", "a limit", "a permutation")),
    ),
    "coding": ((
        ("Write a Python function that {t}", "Show me a unit test for a function that {t}",
         "Write a JavaScript function that {t}", "What is the time complexity of a function that {t}?",
         "Write a C++ function that {t}", "My Python function that {t} is slow. How can I speed it up?"),
        ("reverses the words in a sentence", "counts the vowels in a string", "merges two sorted lists",
         "removes duplicates from a list", "checks if a string is a palindrome", "returns the n-th Fibonacci number",
         "sorts people by age", "validates an email address", "flattens a nested list", "groups orders by customer",
         "parses a date string", "finds the most common word in a text", "rotates a matrix by 90 degrees",
         "converts Celsius to Fahrenheit", "lists the primes below 100")), (
        ("How do I {t} in Python?", "How do I {t} in JavaScript?", "Write a bash one-liner to {t}",
         "What is the simplest way to {t}?"),
        ("read a CSV file and sum a column", "find the largest file in a folder", "call a REST API and print JSON",
         "rename many files at once", "schedule a task every hour", "read a JSON config file",
         "count the lines of every file in a folder")), (
        ("Explain what this code does:\n", "Fix the bug in this code:\n", "Write a SQL query that",
         "Write a regular expression that"),
        ("",)),
    ),
    "extraction": ((
        ("Summarize the following paragraph about {t} in one sentence:\n", "Extract all the dates from this text about "
         "{t}:\n", "List the names of the people mentioned in this article about {t}:\n", "Turn this text about {t} "
         "into three bullet points:\n", "What is the main point of this passage about {t}?\n", "Classify the "
         "sentiment of this review of {t}:\n", "Pull out the key numbers from this report on {t}:\n",
         "Give this email about {t} a subject line:\n", "Convert this list about {t} into a table:\n"),
        ("a new phone", "a local election", "a football match", "the weather this week", "a company's sales",
         "a science fair", "a hotel stay", "a cooking class", "a film premiere", "a city budget", "a running shoe",
         "a train strike", "a museum opening", "a software update", "a farmers' market")),
    ),
    "stem": ((
        ("Explain how {t} works", "Explain {t} to a ten-year-old", "What are the main uses of {t}?",
         "Describe the history of {t} briefly", "Give me three fun facts about {t}", "What are the limits of {t}?"),
        ("photosynthesis", "a refrigerator", "plate tectonics", "vaccines", "a transistor", "DNA replication",
         "the immune system", "an electric motor", "a nuclear reactor", "GPS", "the greenhouse effect", "antibiotics",
         "a rainbow", "a black hole", "radar", "a heat pump", "carbon dating", "a solar panel")), (
        ("Why does {t}?", "What makes {t}?", "Explain the physics of why {t}"),
        ("ice float on water", "the sky look blue", "a volcano erupt", "lightning strike tall objects",
         "bread rise", "a magnet stick to a fridge", "the moon change shape", "metal feel colder than wood")), (
        ("What is the difference between {t}?", "Compare {t} in a short table"),
        ("viruses and bacteria", "weather and climate", "mitosis and meiosis", "speed and velocity",
         "an atom and a molecule", "AC and DC current", "a comet and an asteroid")),
    ),
    "humanities": ((
        ("What were the causes of {t}?", "Describe daily life during {t}", "Who were the key figures of {t}?",
         "Write a short essay on {t}", "What can we learn from {t}?", "Explain the legacy of {t}"),
        ("the Renaissance", "the Industrial Revolution", "the French Revolution", "the Roman Republic",
         "the Cold War", "the abolition of slavery", "the Enlightenment", "the Meiji era", "the Harlem Renaissance",
         "the building of the railways", "the age of sail", "the space race")), (
        ("Explain the main ideas of {t}", "Why is {t} important today?", "Summarize the debate about {t}",
         "Compare {t} with a modern equivalent", "How did {t} change the world?"),
        ("stoicism", "the printing press", "the Silk Road", "utilitarianism", "the invention of writing",
         "impressionist painting", "existentialism", "jazz music", "human rights", "folk tales", "the Olympic Games",
         "democracy in ancient Athens", "the scientific method", "public libraries")),
    ),
}

KINDS = tuple(CATEGORIES)


def openings(kind: str, categories=None) -> list[str]:
    """Every opening ``seed_text`` can draw for ``kind`` (stems without a topic once)."""
    cats = CATEGORIES if categories is None else categories
    return [stem.replace("{t}", t) for stems, topics in cats[kind] for stem in stems
            for t in (topics if "{t}" in stem else topics[:1])]


def seed_text(seed: int, i: int, categories=None) -> tuple[str, str]:
    """``(kind, opening)``: conversation ``i``'s kind (uniform over the kinds of ``categories``, default
    ``CATEGORIES``) and the opening of its user turn, one of that kind's stems with one of its group's topics
    (uniform over the kind's openings), drawn from ``default_rng([seed, i])``."""
    cats = CATEGORIES if categories is None else categories
    kinds = tuple(cats)
    rng = np.random.default_rng([seed, i])
    kind = kinds[int(rng.integers(len(kinds)))]
    groups = cats[kind]
    sizes = np.asarray([len(s) * len(t) for s, t in groups], np.float64)
    stems, topics = groups[int(rng.choice(len(groups), p=sizes / sizes.sum()))]
    stem = stems[int(rng.integers(len(stems)))]
    return kind, stem.replace("{t}", topics[int(rng.integers(len(topics)))])


def seed_count(categories=None) -> int:
    """How many distinct openings ``seed_text`` can draw."""
    cats = CATEGORIES if categories is None else categories
    return sum(len(set(openings(k, cats))) for k in cats)


_WORD = re.compile(r"[a-z0-9]+")
EVAL_FIELDS = ("turns", "prompt", "question")  # MT-Bench's, HumanEval's, GSM8K's


def eval_texts(path: str) -> list[str]:
    """The question texts of an evaluation set's JSON-lines file (``.jsonl`` or ``.jsonl.gz``): per line, every
    turn of ``turns`` (MT-Bench), or ``prompt`` (HumanEval), or ``question`` (GSM8K); ``ValueError`` naming the
    file and line when a line has none of them."""
    opener = gzip.open if str(path).endswith(".gz") else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            field = next((k for k in EVAL_FIELDS if k in row), None)
            if field is None:
                raise ValueError(f"{path}:{n}: expected one of the fields {list(EVAL_FIELDS)}, got {sorted(row)}")
            value = row[field]
            out += [str(t) for t in value] if isinstance(value, list) else [str(value)]
    return out


def words(text: str) -> list[str]:
    """Lower-case alphanumeric words (the unit ``eval_overlap`` compares)."""
    return _WORD.findall(text.lower())


def eval_overlap(texts, questions, n: int = 8) -> list[tuple[int, int]]:
    """``[(i, j), ...]``: every text ``i`` sharing a run of ``n`` words with evaluation question ``j`` (or, for a
    question shorter than ``n`` words, containing the whole question). Empty: nothing of the evaluation set is
    in ``texts``."""
    index: dict[tuple, set] = {}
    short = []
    for j, q in enumerate(questions):
        w = words(q)
        if len(w) < n:
            short.append((j, " ".join(w)))
        for k in range(len(w) - n + 1):
            index.setdefault(tuple(w[k:k + n]), set()).add(j)
    hits = []
    for i, t in enumerate(texts):
        w = words(t)
        found = set()
        for k in range(len(w) - n + 1):
            found |= index.get(tuple(w[k:k + n]), set())
        joined = " ".join(w)
        found |= {j for j, q in short if q and f" {q} " in f" {joined} "}
        hits += [(i, j) for j in sorted(found)]
    return hits
