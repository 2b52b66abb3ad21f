"""The training prompt pool, assembled offline from templates.

Self-distillation only needs *questions*: the target writes the answers. The pool is generated
from templates x subjects with a fixed seed, so it is reproducible, needs no download, and is
kept apart from every evaluation set (tests check that no pool prompt appears in `prompts/` or
HumanEval).
"""

from __future__ import annotations

import random

SUBJECTS = [
    "photosynthesis", "black holes", "the French Revolution", "compound interest", "vaccines",
    "plate tectonics", "the water cycle", "machine learning", "the stock market", "volcanoes",
    "the Roman Empire", "electric cars", "honey bees", "climate change", "the printing press",
    "quantum computing", "coral reefs", "the human heart", "inflation", "renewable energy",
    "the moon landing", "DNA", "earthquakes", "the internet", "chess", "jazz music",
    "the Great Wall of China", "antibiotics", "recycling", "solar panels", "rainforests",
    "the Olympic Games", "democracy", "supply and demand", "the immune system", "glaciers",
    "origami", "coffee", "bicycles", "the periodic table", "tides", "meditation",
    "public transport", "password security", "open source software", "sourdough bread",
    "hurricanes", "the Renaissance", "sleep", "bridges", "languages", "time zones",
]
AUDIENCES = ["a child", "a high-school student", "a busy manager", "a beginner", "an expert", "my grandmother"]
CHAT_TEMPLATES = [
    "Explain {s} to {a}.",
    "Give me three interesting facts about {s}.",
    "What are the pros and cons of {s}?",
    "Write a short poem about {s}.",
    "Summarize the history of {s} in a few sentences.",
    "What are common misconceptions about {s}?",
    "How would you teach {s} to {a}?",
    "Write a short story that involves {s}.",
    "List five questions someone might ask about {s}, with brief answers.",
    "Why does {s} matter today?",
    "Compare {s} and {t}.",
    "Write an email to a friend recommending they learn about {s}.",
    "Describe {s} in exactly three sentences.",
    "What would happen if {s} disappeared tomorrow?",
    "Give a step-by-step explanation of how {s} works.",
]
CODE_TASKS = [
    "reverses the words in a sentence", "counts the vowels in a string", "checks whether a number is prime",
    "returns the n-th Fibonacci number", "flattens a nested list", "merges two sorted lists",
    "removes duplicates from a list while keeping order", "computes the factorial of n",
    "finds the longest word in a sentence", "converts Celsius to Fahrenheit", "checks if a string is a palindrome",
    "returns the greatest common divisor of two integers", "groups words by their first letter",
    "computes the running average of a list", "transposes a matrix given as a list of lists",
    "counts word frequencies in a text", "validates that brackets in a string are balanced",
    "rotates a list by k positions", "returns all pairs in a list that sum to a target",
    "converts a Roman numeral to an integer", "computes the median of a list", "parses a CSV line into fields",
    "finds the second largest number in a list", "returns the binary representation of an integer",
    "implements binary search on a sorted list", "capitalizes the first letter of every word",
]
CODE_TEMPLATES = [
    "Write a Python function that {c}.",
    "Write a Python function that {c}. Include a docstring and two examples.",
    "Implement a function in Python which {c}, and explain its time complexity.",
    "Show a short JavaScript function that {c}.",
]
MATH_TEMPLATES = [
    "A shop sells pencils for {x} cents each. How much do {y} pencils cost in dollars?",
    "Tom has {x} apples and gives {y} to his friend. He then buys {z} more. How many apples does he have?",
    "A train travels {x} km in {y} hours. What is its average speed?",
    "If a recipe needs {x} eggs for {y} people, how many eggs are needed for {z} people?",
    "What is {x} percent of {z}?",
    "A rectangle is {x} cm long and {y} cm wide. What are its area and perimeter?",
    "Sara saves {x} dollars a week. How many weeks does she need to save {z} dollars?",
]


def build_pool(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct user prompts (chat 60%, code 25%, math 15%)."""
    rng = random.Random(seed)
    out: dict[str, None] = {}
    for _ in range(100 * n):  # the templates give thousands of distinct prompts
        if len(out) == n:
            break
        r = rng.random()
        if r < 0.6:
            s, t = rng.sample(SUBJECTS, 2)
            p = rng.choice(CHAT_TEMPLATES).format(s=s, t=t, a=rng.choice(AUDIENCES))
        elif r < 0.85:
            p = rng.choice(CODE_TEMPLATES).format(c=rng.choice(CODE_TASKS))
        else:
            x, y, z = rng.randint(2, 90), rng.randint(2, 12), rng.randint(20, 400)
            p = rng.choice(MATH_TEMPLATES).format(x=x, y=y, z=z)
        out[p] = None
    if len(out) < n:
        raise ValueError(f"the templates yield only {len(out)} distinct prompts, {n} asked")
    return list(out)

