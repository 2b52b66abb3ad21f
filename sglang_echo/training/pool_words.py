"""Word lists and templates of the prompt pool's question-answering, retrieval, translation and
multi-turn kinds (``pool_kinds``); data only. Like ``pool_vocab``, kept apart from the evaluation
sets (tests check the rendered pool against `prompts/` and HumanEval)."""

COUNTRIES = [
    "Argentina", "Brazil", "Canada", "Chile", "Egypt", "Ethiopia", "Finland", "Ghana", "Greece", "Iceland",
    "India", "Indonesia", "Ireland", "Italy", "Kenya", "Mexico", "Mongolia", "Morocco", "Nepal", "New Zealand",
    "Nigeria", "Norway", "Peru", "Poland", "Portugal", "South Korea", "Spain", "Sweden", "Switzerland",
    "Thailand", "Turkey", "Vietnam", "Colombia", "Austria", "Hungary", "Malaysia", "the Philippines",
    "Tanzania", "Uruguay", "Scotland",
]  # fmt: skip
COUNTRY_QUESTIONS = [
    "What is the capital of {c}, and what is it known for?",
    "Which languages are spoken in {c}?",
    "What currency is used in {c}?",
    "Describe the climate of {c} across the year.",
    "What are the main industries of {c}?",
    "Give a short overview of the history of {c}.",
    "What traditional dishes come from {c}?",
    "Which famous landmarks can visitors see in {c}?",
    "What is the geography of {c} like?",
    "Which holidays are widely celebrated in {c}?",
]
ANIMALS = [
    "elephants", "penguins", "owls", "dolphins", "wolves", "kangaroos", "giraffes", "bats", "sharks",
    "ants", "snails", "crows", "frogs", "tortoises", "camels", "polar bears", "hedgehogs", "jellyfish",
    "parrots", "salmon", "beavers", "koalas", "zebras", "seahorses", "spiders", "butterflies", "otters",
    "eagles", "pandas", "rhinos",
]  # fmt: skip
ANIMAL_QUESTIONS = [
    "What do {x} eat?",
    "Where do {x} live in the wild?",
    "How long do {x} usually live?",
    "How do {x} raise their young?",
    "How do {x} communicate with each other?",
    "What are the main threats to {x}?",
    "How do {x} survive the winter?",
]
INVENTIONS = [
    "the light bulb", "the steam engine", "the bicycle", "the printing press", "the microscope",
    "the telescope", "the radio", "the refrigerator", "the compass", "the airplane", "the camera",
    "the typewriter", "the transistor", "the washing machine", "the vaccine against smallpox", "paper",
    "the mechanical clock", "the sewing machine", "the World Wide Web", "the battery", "the elevator",
    "the barcode", "the microwave oven", "the jet engine", "plastic", "the zipper",
]  # fmt: skip
INVENTION_QUESTIONS = [
    "Who invented {x}, and when?",
    "How did {x} change everyday life?",
    "How does {x} work?",
    "What problem was {x} designed to solve?",
    "What came before {x}, and why was it replaced?",
]
SUBJECT_QUESTIONS = [
    "What is the most important idea behind {s}?",
    "Who are some of the key people in the history of {s}?",
    "When did people first start to study {s}?",
    "What is a question people often ask about {s}, and what is its answer?",
    "How is {s} measured or studied today?",
    "What is one surprising fact about {s} that most people do not know?",
    "How does {s} affect ordinary people?",
    "What are the main parts or stages of {s}?",
]
# Explanatory questions, each about one thing (the split's group).
WHY_QUESTIONS = [
    "Why does ice float on water?",
    "Why do leaves change colour in autumn?",
    "Why do we have leap years?",
    "Why does bread go stale?",
    "Why do cats purr?",
    "Why is sea water salty?",
    "Why do onions make people cry?",
    "Why do planes leave white trails in the sky?",
    "Why do we yawn?",
    "Why does metal feel colder than wood at the same temperature?",
    "Why does the moon look bigger near the horizon?",
    "Why do some people need glasses?",
    "Why do bubbles form when water boils?",
    "Why do stars twinkle?",
    "Why does a spoon look bent in a glass of water?",
    "Why do hands get wrinkly in the bath?",
    "Why are flamingos pink?",
    "Why do we get goosebumps?",
    "Why does popcorn pop?",
    "Why does a compass point north?",
    "Why do apples turn brown after being cut?",
    "Why do our ears pop on an airplane?",
    "Why does the ocean have waves?",
    "Why do some trees lose their leaves in winter?",
    "How does a refrigerator keep food cold?",
    "How do bees make honey?",
    "How does a rainbow form?",
    "How do vaccines train the immune system?",
    "How does a microwave oven heat food?",
    "How do noise-cancelling headphones work?",
    "How do birds know where to migrate?",
    "How does soap remove dirt?",
    "How is glass made?",
    "How does a submarine dive and surface?",
    "How do touch screens detect a finger?",
    "How do plants drink water?",
    "How does a hot-air balloon fly?",
    "How does a credit score work?",
    "How does recycling paper work?",
    "How does the body heal a broken bone?",
    "How do solar cells turn light into electricity?",
    "How does a lock and key work?",
    "How do hurricanes get their names?",
    "How is chocolate made from cocoa beans?",
    "How does a thermostat control the temperature of a room?",
    "How do electric guitars make sound?",
    "How does the post office sort letters?",
    "How does caffeine keep people awake?",
    "How do fireflies glow?",
    "How are mountains formed?",
]
QA_STYLES = [
    "",
    " Answer in one paragraph.",
    " Keep the answer short.",
    " Explain it step by step.",
    " Give an example.",
    " Answer for {a}.",
]
PYTHON_QUESTIONS = [
    "What does `{f}` do in Python's standard library?",
    "When would I use `{f}` in Python?",
    "What does `{f}` return, and what arguments does it take?",
    "Is there anything tricky about using `{f}` in Python?",
]
# --- retrieval-augmented answers: invented entities, so the answer can only come from the passage
NAME_STARTS = [
    "Bel", "Cor", "Dun", "El", "Fen", "Gal", "Har", "Is", "Kel", "Lor", "Mar", "Nor", "Or", "Pel",
    "Quin", "Ros", "Sil", "Tor", "Ul", "Vel", "Wen", "Yar", "Zan", "Brom", "Cal", "Tam",
]  # fmt: skip
NAME_ENDS = [
    "bury", "dale", "ford", "holm", "mere", "mont", "ridge", "stead", "vale", "wick", "wood", "haven",
    "field", "gate", "moor", "brook",
]  # fmt: skip
FIRST_NAMES = [
    "Ada", "Bruno", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Keiko", "Luca",
    "Mira", "Nils", "Olga", "Pavel", "Rosa", "Samir", "Tessa", "Umar", "Vera", "Walter", "Yusuf", "Zoe",
]  # fmt: skip
LAST_NAMES = [
    "Albers", "Brandt", "Castillo", "Dufour", "Eriksen", "Fontaine", "Gallo", "Hartmann", "Ivanova",
    "Jensen", "Kowalski", "Lindqvist", "Moreau", "Novak", "Okafor", "Petrov", "Quintero", "Rossi",
    "Silva", "Tanaka", "Varga", "Weber",
]  # fmt: skip
REGIONS = ["the north", "the south", "the east", "the west", "the centre", "the mountains", "the coast"]
PRODUCTS = [
    "cheese", "pottery", "woollen blankets", "apple cider", "wooden toys", "glass beads", "smoked fish",
    "honey", "leather boots", "copper pans", "paper lanterns", "olive oil",
]  # fmt: skip
FESTIVALS = ["lantern", "harvest", "kite", "music", "boat", "pumpkin", "storytelling", "flower"]
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
    "November", "December",
]  # fmt: skip
# (company suffix, what it makes, what one unit is called)
COMPANY_LINES = [
    ("Bikes", "electric bicycles", "bicycle"),
    ("Audio", "wireless headphones", "headphone set"),
    ("Robotics", "warehouse robots", "robot"),
    ("Foods", "frozen dumplings", "box of dumplings"),
    ("Textiles", "outdoor jackets", "jacket"),
    ("Labs", "water filters", "filter"),
    ("Instruments", "digital pianos", "piano"),
    ("Home", "smart thermostats", "thermostat"),
]
DEVICES = ["e-reader", "smart speaker", "robot vacuum", "pair of wireless earbuds", "electric toothbrush", "bike light"]
BUTTONS = ["power", "reset", "menu", "home", "mode"]
COLOURS = ["green", "blue", "white", "orange", "purple"]
CREATURES = ["tree frog", "beetle", "lizard", "moth", "songbird", "shrew", "crab", "bat"]
HABITATS = ["wet forests", "high meadows", "river banks", "sand dunes", "limestone caves", "salt marshes"]
FOODS = ["seeds", "small insects", "berries", "snails", "algae", "flower nectar"]
RAG_INSTRUCTIONS = [
    "Answer the question using only the passage below.\n\n{doc}\n\nQuestion: {q}",
    "Read the text and answer the question that follows.\n\nText: {doc}\n\nQuestion: {q}",
    "{doc}\n\nBased on the passage above, {ql}",
    "Here is some background information:\n\n{doc}\n\nUsing it, answer this: {q}",
    "Context:\n{doc}\n\nQuestion: {q}\nAnswer using the context, and say so if it does not contain the answer.",
]
RAG_MULTI_INSTRUCTIONS = [
    "Answer the question using the documents below. Name the document your answer comes from.\n\n{docs}"
    "\n\nQuestion: {q}",
    "You are given several search results.\n\n{docs}\n\nUsing only these results, answer: {q}",
]
DOC_QUESTIONS = [
    "What does `{f}` do, according to this documentation?",
    "When should `{f}` be used, according to the text?",
    "Summarize in one sentence what the documentation says about `{f}`.",
    "What does the documentation say about the arguments of `{f}`?",
]
DOC_INSTRUCTIONS = [
    "Here is the documentation of `{f}`:\n\n{doc}\n\n{q}",
    "Read this excerpt from the Python documentation and answer the question.\n\n{doc}\n\nQuestion: {q}",
]
# --- multi-turn openers and follow-ups (earlier assistant turns are templated, see pool_kinds)
INVENT_OPENERS = {
    "town": [
        "I am writing a story set in an invented town. Describe the town for me.",
        "Invent a small town for a tabletop game and give me the key facts about it.",
    ],
    "company": [
        "Make up a company for a business-class case study and describe it.",
        "Invent a small manufacturer I can use as an example in a presentation.",
    ],
    "species": [
        "Invent an animal species for my fantasy novel and describe it briefly.",
        "Make up a small creature for a nature documentary parody and give me the facts.",
    ],
    "device": [
        "Write a short product description for a gadget you make up.",
        "Invent a household gadget for a design class and describe how to use it.",
    ],
}
INVENT_FOLLOWUPS = [
    "Now write the opening paragraph of a story set there.",
    "Write a short news report about something that happens there.",
    "Give me five questions a journalist might ask about it.",
    "Write a short advertisement based on these facts.",
    "Turn these facts into a table.",
    "Describe a typical day there from the point of view of a child.",
    "What could go wrong there in the next ten years? Give three ideas.",
]
INVENT_LAST_TURNS = [
    "Write a short scene based on that.",
    "Put everything we know so far into a short encyclopedia entry.",
    "Write a tweet about it.",
    "Summarize everything so far in two sentences.",
]
TRANSLATE_REQUESTS = [
    "Translate the following text into {tgt}.\n\n{text}",
    "Translate into {tgt}: {text}",
    'Please translate this from {src} to {tgt}:\n\n"{text}"',
    'How would you say this in {tgt}? "{text}"',
    "Translate the following {src} text into {tgt} and explain any difficult words.\n\n{text}",
    "Give a natural {tgt} translation of this:\n{text}",
    "Translate this into {tgt}, keeping the tone informal.\n\n{text}",
    "I need this in {tgt} for a letter. Can you translate it?\n\n{text}",
]
TRANSLATE_FOLLOWUPS = [
    "Now translate it into {tgt}.",
    "Explain the grammar of that sentence.",
    "Give me two other ways to say the same thing in {lang}.",
    "Which words there are hard for learners, and why?",
    "Is that formal or informal? Write the other version too.",
]
TRANSLATE_LAST_TURNS = [
    "Which of the two versions is closer to the English, and why?",
    "Compare the word order in the two translations.",
    "Now write a short dialogue that uses one of these sentences.",
]
FUNCTION_OPENERS = [
    "What does `{f}` from the Python standard library do?",
    "I found `{f}` in some Python code. What is it for?",
]
FUNCTION_FOLLOWUPS = [
    "Show me a short example that uses it.",
    "When would I use it instead of writing my own code?",
    "Write a function of my own that does something similar, without using it.",
    "What could go wrong if I call it with bad input?",
    "Explain it again for a beginner.",
]
FUNCTION_LAST_TURNS = [
    "Show me a short example of calling it with those arguments.",
    "Write a unit test that checks how it behaves.",
    "Which of those arguments would a beginner most likely get wrong?",
]
NAME_REQUESTS = [
    "Suggest three names for a new {shop}.",
    "I am opening a {shop}. Give me three name ideas.",
]
SHOPS = [
    "bookshop", "bicycle repair shop", "tea room", "flower shop", "pet grooming salon", "second-hand record store",
    "vegan bakery", "board game café", "plant nursery", "climbing gym", "ice cream parlour", "tailor's shop",
]  # fmt: skip
NAME_WORDS = [
    "Corner", "Lantern", "Harbour", "Willow", "Maple", "Copper", "Golden", "Little", "Blue", "Orchard",
    "Meadow", "Sparrow", "Juniper", "Pebble", "Sunny", "Velvet",
]  # fmt: skip
NAME_FOLLOWUPS = [
    "I like {name}. Write a slogan for it.",
    "Let's go with {name}. Write a short announcement for the opening day.",
    "Write a short description of {name} for its website.",
    "Which of the three would appeal most to young people, and why?",
]
