"""Word lists and templates of the training prompt pool (``prompt_pool``); data only.

Kept apart from the evaluation sets in `prompts/`: none of these templates reproduces one of
their prompts (tests check the rendered pool, not just these lists).
"""

SUBJECTS = [
    # science and nature
    "photosynthesis", "black holes", "plate tectonics", "the water cycle", "volcanoes", "honey bees",
    "coral reefs", "the human heart", "DNA", "earthquakes", "antibiotics", "rainforests", "glaciers",
    "tides", "the periodic table", "hurricanes", "sleep", "the immune system", "gravity", "magnetism",
    "the speed of light", "evolution", "the carbon cycle", "bacteria", "viruses", "the brain", "the moon",
    "Mars", "comets", "the Milky Way", "deserts", "migratory birds", "octopuses", "whales", "fungi",
    "the ozone layer", "electricity", "atoms", "sound waves", "rainbows", "lightning", "fossils",
    "dinosaurs", "the human skeleton", "digestion", "blood types", "allergies", "vitamins", "caffeine",
    "ocean currents", "wind power", "nuclear fusion", "batteries", "friction", "the seasons", "clouds",
    # technology
    "machine learning", "the internet", "quantum computing", "electric cars", "solar panels",
    "password security", "open source software", "databases", "cloud computing", "smartphones",
    "GPS", "encryption", "robots", "3D printing", "video games", "search engines", "email spam",
    "compilers", "operating systems", "computer viruses", "blockchain", "Wi-Fi", "self-driving cars",
    "spreadsheets", "version control", "web browsers", "social media", "virtual reality", "drones",
    "recommendation systems", "unit testing", "programming languages", "APIs", "data privacy",
    # history and society
    "the French Revolution", "the Roman Empire", "the printing press", "the moon landing",
    "the Great Wall of China", "the Olympic Games", "democracy", "the Renaissance", "ancient Egypt",
    "the Industrial Revolution", "the Silk Road", "the Vikings", "the Cold War", "the Magna Carta",
    "the invention of the telephone", "the history of money", "the United Nations", "libraries",
    "public transport", "time zones", "languages", "maps", "the postal service", "castles", "pirates",
    # economics and work
    "compound interest", "the stock market", "inflation", "supply and demand", "budgeting",
    "credit cards", "taxes", "small businesses", "remote work", "job interviews", "negotiation",
    "marketing", "insurance", "retirement savings", "unemployment", "international trade", "startups",
    # daily life, arts and culture
    "vaccines", "climate change", "recycling", "renewable energy", "chess", "jazz music", "origami",
    "coffee", "tea", "bicycles", "meditation", "sourdough bread", "bridges", "gardening", "camping",
    "photography", "painting", "poetry", "theatre", "film editing", "learning a language", "running",
    "yoga", "swimming", "football", "basketball", "cooking pasta", "baking cookies", "chocolate",
    "cheese", "spices", "houseplants", "dogs", "cats", "horses", "time management", "habits",
    "friendship", "public speaking", "writing a novel", "minimalism", "board games", "museums",
    "architecture", "fashion", "tattoos", "opera", "the guitar", "the piano", "comics", "mythology",
]
AUDIENCES = [
    "a child", "a high-school student", "a busy manager", "a beginner", "an expert", "my grandmother",
    "a new employee", "a tourist", "a university student", "a software engineer", "a teacher", "a nurse",
]
FORMATS = ["a short paragraph", "three bullet points", "a numbered list", "one sentence", "a table", "simple words"]
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
    "Explain {s} using {f}.",
    "What is the connection between {s} and {t}?",
    "Write a limerick about {s}.",
    "Create a short quiz with four questions about {s}.",
    "What should {a} know about {s}?",
    "Tell me a fun fact about {s} and explain why it is true.",
    "Write a dialogue between two friends arguing about {s}.",
    "What are the biggest open questions about {s}?",
    "Give an analogy that explains {s}.",
    "Write a product description for a book about {s}.",
    "How has {s} changed over the last hundred years?",
    "What careers involve {s}?",
    "Write a tweet about {s}.",
    "Define {s} and give two examples.",
    "Write a short speech about {s} for {a}.",
]
PERSONS = [
    "my boss", "a colleague", "my landlord", "a customer", "my teacher", "a neighbour", "my team",
    "a job recruiter", "my sister", "an old friend", "the school principal", "a hotel manager",
]
ACTIVITIES = [
    "learning to cook", "studying for exams", "running a marathon", "saving money", "moving to a new city",
    "starting a podcast", "writing a CV", "learning to code", "training a puppy", "planting a vegetable garden",
    "hosting a dinner party", "staying focused at work", "getting up early", "travelling on a budget",
    "making new friends", "reducing screen time", "preparing for a job interview", "keeping a journal",
    "learning to draw", "organising a wedding", "buying a used car", "painting a room", "cycling to work",
]
THINGS = [
    "a rainy afternoon", "an old lighthouse", "a lost umbrella", "the first snow of winter", "a busy train station",
    "a cup of hot chocolate", "a sleepy fox", "a city at night", "a forgotten letter", "a mountain lake",
    "a robot learning to dance", "a dragon who is afraid of fire", "a library after closing time",
    "a lighthouse keeper", "a paper boat", "an autumn forest", "a street musician", "a tiny island",
]
PAIRS = [
    ("a virus", "a bacterium"), ("weather", "climate forecasts"), ("a loan", "a grant"), ("RAM", "disk space"),
    ("a lake", "a pond"), ("speed", "velocity"), ("an alligator", "a crocodile"), ("baking soda", "baking powder"),
    ("a list", "a tuple in Python"), ("TCP", "UDP"), ("a simile", "a metaphor"), ("stocks", "bonds"),
    ("mass", "weight"), ("a comet", "an asteroid"), ("empathy", "sympathy"), ("a CPU", "a GPU"),
    ("a debit card", "a credit card"), ("affect", "effect"), ("a frog", "a toad"), ("SQL", "NoSQL databases"),
    ("a hurricane", "a tornado"), ("HTTP", "HTTPS"), ("a recession", "a depression"), ("jam", "jelly"),
]
TASK_TEMPLATES = [
    "Give me {n} tips for {act}.",
    "I want to start {act}. Where should I begin?",
    "Make a one-week plan for {act}.",
    "What mistakes do people make when {act}?",
    "Write a haiku about {thing}.",
    "Write a short story about {thing}.",
    "Describe {thing} in vivid detail.",
    "Write a polite email to {p} asking for a day off.",
    "Write a short message to {p} thanking them for their help.",
    "Write an email to {p} explaining that a project will be late.",
    "How do I tell {p} that I disagree with them?",
    "What is the difference between {x} and {y}?",
    "Is {x} the same as {y}? Explain briefly.",
    "Plan a {n}-day trip for someone who loves {s}.",
    "Suggest {n} names for a shop about {s}.",
    "Write a short advertisement for a class on {act}.",
    "Answer in {f}: why is {act} hard?",
    "Write a motivational message for someone who is {act}.",
    "Give me a checklist for {act}.",
    "Write a children's story about {thing}.",
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
    "checks whether two strings are anagrams", "returns the sum of the digits of a number",
    "finds the most common element in a list", "splits a list into chunks of size n",
    "converts a string to snake_case", "computes the dot product of two vectors",
    "returns the prime factors of an integer", "checks whether a year is a leap year",
    "computes the power set of a list", "removes all whitespace from a string",
    "returns the indices of the k largest values", "encodes a string with a Caesar cipher",
    "sorts a list of dictionaries by a given key", "counts the islands in a grid of 0s and 1s",
]
CODE_TEMPLATES = [
    "Write a Python function that {c}.",
    "Write a Python function that {c}. Include a docstring and two examples.",
    "Implement a function in Python which {c}, and explain its time complexity.",
    "Show a short JavaScript function that {c}.",
    "Write a Python function that {c}, with type hints.",
    "Write a Python function that {c}, and a few unit tests for it.",
]
MATH_TEMPLATES = [
    "A shop sells pencils for {x} cents each. How much do {y} pencils cost in dollars?",
    "{p} has {x} apples and gives {y} to a friend, then buys {z} more. How many apples does {p} have?",
    "A train travels {x} km in {y} hours. What is its average speed?",
    "If a recipe needs {x} eggs for {y} people, how many eggs are needed for {z} people?",
    "What is {x} percent of {z}?",
    "A rectangle is {x} cm long and {y} cm wide. What are its area and perimeter?",
    "{p} saves {x} dollars a week. How many weeks are needed to save {z} dollars?",
    "A class has {z} students and {x} percent of them walk to school. How many walk?",
    "A car uses {y} litres of fuel per 100 km. How much fuel does it need for {z} km?",
    "{p} reads {x} pages a day. How many days does a {z}-page book take?",
    "A box holds {y} bottles. How many boxes are needed for {z} bottles?",
    "A jacket costs {z} dollars and is on sale for {x} percent off. What is the sale price?",
    "{p} is {x} years old. How old will {p} be in {y} years, and how old was {p} {y} years ago?",
    "A garden is a square with sides of {y} metres. How much fencing is needed to surround it?",
    "There are {z} marbles shared equally among {y} children. How many does each child get, and how many are left over?",
    "A bus leaves every {x} minutes. How many buses leave in {y} hours?",
]
