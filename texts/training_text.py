"""Distillation text: a seeded template grammar, so any machine can rebuild it offline.

    python -m texts.training_text --count 12000 --seed 0 --out outputs/training_text.txt

Templates in four speaking styles (virtual streamer, game NPC, customer support, audiobook
narration) plus everyday statements and questions are filled from slot vocabularies. Names
and places such as Ruairi, Llanelli, Bach and Provence are there on purpose: they are what
makes espeak emit its rare English symbols (r, ɬ, x, the nasal mark), so the student hears
every phoneme the teacher can say. Sentences of the eval and calibration sets are filtered
out (compared after ``texts.normalize``); tests/test_texts.py also checks the Harvard lists.
"""
from __future__ import annotations

import argparse
import os
import random
import re
import tempfile
from pathlib import Path

from texts import load_sentences, normalize

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_IRREGULAR_ORDINALS = {"one": "first", "two": "second", "three": "third", "five": "fifth",
                       "eight": "eighth", "nine": "ninth", "twelve": "twelfth"}


def number_words(number: int) -> str:
    """0 <= number < 1,000,000 in words: 342 -> 'three hundred and forty-two'."""
    if number < 20:
        return _ONES[number]
    if number < 100:
        tens, ones = divmod(number, 10)
        return _TENS[tens - 2] + (f"-{_ONES[ones]}" if ones else "")
    if number < 1000:
        hundreds, rest = divmod(number, 100)
        return f"{_ONES[hundreds]} hundred" + (f" and {number_words(rest)}" if rest else "")
    thousands, rest = divmod(number, 1000)
    if not rest:
        return f"{number_words(thousands)} thousand"
    joiner = " and " if rest < 100 else " "
    return f"{number_words(thousands)} thousand{joiner}{number_words(rest)}"


def ordinal_words(number: int) -> str:
    """1 -> 'first', 23 -> 'twenty-third', 40 -> 'fortieth'."""
    head, _, last = number_words(number).rpartition("-")
    if last in _IRREGULAR_ORDINALS:
        last = _IRREGULAR_ORDINALS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return f"{head}-{last}" if head else last


def _clock(rng: random.Random) -> str:
    hour = number_words(rng.randint(1, 12))
    minute = rng.randint(1, 59)
    return rng.choice((
        f"{hour} o'clock",
        f"half past {hour}",
        f"a quarter to {hour}",
        f"{hour} {'oh ' if minute < 10 else ''}{number_words(minute)}",
    ))


# Verbs as (base, past, participle); every one of them takes any _OBJECTS entry.
_VERBS = (
    ("find", "found", "found"), ("lose", "lost", "lost"), ("paint", "painted", "painted"),
    ("repair", "repaired", "repaired"), ("borrow", "borrowed", "borrowed"),
    ("deliver", "delivered", "delivered"), ("drop", "dropped", "dropped"),
    ("carry", "carried", "carried"), ("clean", "cleaned", "cleaned"), ("sell", "sold", "sold"),
    ("buy", "bought", "bought"), ("hide", "hid", "hidden"), ("wrap", "wrapped", "wrapped"),
    ("polish", "polished", "polished"), ("photograph", "photographed", "photographed"),
    ("measure", "measured", "measured"), ("return", "returned", "returned"),
    ("pack", "packed", "packed"), ("steal", "stole", "stolen"), ("forget", "forgot", "forgotten"),
    ("examine", "examined", "examined"), ("weigh", "weighed", "weighed"),
    ("unload", "unloaded", "unloaded"), ("guard", "guarded", "guarded"),
)
_OBJECTS = (
    "a brass lantern", "the broken umbrella", "a basket of warm croissants", "the silver key",
    "an envelope with no stamp", "a map of the northern coast", "a crate of green apples",
    "the heavy oak chest", "a stack of vinyl records", "a songbook of Bach chorales",
    "a bag of roasted chestnuts", "the cracked mirror", "a bundle of dry firewood",
    "a jar of pickled onions", "the leather saddle", "a pair of muddy boots",
    "a thermos of hot cocoa", "a tiny ceramic owl", "the garden hose", "a box of fireworks",
    "the violin case", "a torn photograph", "a bottle of ginger beer", "the yellow kayak",
    "a beige cotton sweater", "the treasure chest", "a kitten's wicker basket",
    "the birthday cake", "a pouch of gold coins", "the spare bicycle pump",
    "a stack of unpaid invoices", "the queen's jeweled crown", "a sketchbook full of whales",
    "the rusty anchor", "a vase of sunflowers", "the wobbly kitchen stool",
)
_PLURALS = (
    "jars of honey", "wooden crates", "silver coins", "paper lanterns", "loaves of rye bread",
    "boxes of nails", "spare batteries", "healing potions", "train tickets", "wolf pelts",
    "postcards", "pumpkins", "umbrellas", "goose feathers", "chess pieces", "oyster shells",
    "rubber ducks", "teacups", "violin strings", "pine cones",
)
_NAMES = (
    "Ruairi", "Siobhan", "Anika", "Tomasz", "Bartholomew", "Xiomara", "Ngozi", "Aoife",
    "Yusuf", "Beatrix", "Leopold", "Ingrid", "Kofi", "Mei", "Oksana", "Rafael", "Thandiwe",
    "Dmitri", "Astrid", "Lachlan", "Imogen", "Florence", "Hugo", "Juniper", "Quentin",
    "Valentina", "Wendell", "Yolanda", "Zachary", "Gwen", "Rhys", "Dafydd", "Esperanza",
    "Hiroshi", "Fatima", "Geoffrey", "Joaquin", "Kwame", "Maeve", "Ptolemy",
)
_PEOPLE = (
    "the baker", "my neighbor", "our manager", "the old fisherman", "a tired courier",
    "the quiet librarian", "the night guard", "my little brother", "your aunt",
    "the ferry captain", "the village doctor", "a nervous tourist", "the head chef",
    "the blacksmith", "my grandmother", "the new intern", "a retired pilot", "the mayor",
    "the lighthouse keeper", "a travelling juggler",
)
_PLACES = (
    "in Llandudno", "near Llanelli", "in Machynlleth", "by the loch", "across the loch",
    "in Provence", "at the harbor", "behind the old mill", "on the rooftop",
    "at the train station", "in the library", "under the bridge", "in the village square",
    "at the bakery", "in the garage", "beside the frozen pond", "on the ferry",
    "in the attic", "at the night market", "inside the lighthouse", "by the fountain",
    "in the museum's basement", "on the mountain path", "at the bus shelter",
    "in the greenhouse", "at the edge of the forest", "in the hotel lobby",
)
_TIMES = (
    "this morning", "last Tuesday", "before sunrise", "after midnight", "yesterday afternoon",
    "on Friday evening", "during the storm", "over the weekend", "at lunchtime",
    "right before closing", "in the middle of the night", "last winter", "on a whim",
)
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")
_INTERJECTIONS = ("Wow", "Oh no", "Whoa", "Yikes", "Ha", "Oh my goodness", "Unbelievable",
                  "Hooray", "Good grief", "Oops", "Well, well", "Aha")

# Streamer lines.
_GAME_EVENTS = ("headshot", "triple jump", "comeback", "critical hit", "glitch in the wall",
                "speedrun skip", "boss phase", "lucky drop", "rage quit", "perfect parry")
_BOSSES = ("frost giant", "mechanical spider", "swamp witch", "lava golem", "pirate queen",
           "haunted organ", "clockwork dragon", "shadow knight")
_STREAMER_PROMISES = ("sing the next song in a pirate voice", "eat a spoonful of wasabi",
                      "read your comments in a robot voice", "stream for one more hour",
                      "dye my hair purple", "play the next level blindfolded",
                      "do twenty push-ups on camera", "name my next pet after the chat")
# Game NPC lines.
_NPC_GREETINGS = ("Well met", "Halt", "Greetings", "Hail", "Ho there", "Good morrow",
                  "Welcome back", "Easy now", "Ah, there you are")
_NPC_ADDRESSES = ("traveler", "stranger", "adventurer", "friend", "young hero", "wanderer",
                  "good sir", "my lady", "sellsword", "pilgrim")
_NPC_WARNINGS = ("the bridge won't hold a horse", "wolves prowl the pass after dusk",
                 "the mine has been flooded since spring", "bandits watch the eastern road",
                 "the swamp lights lure the careless", "the ferryman has gone missing",
                 "the king's tax collectors are in town", "the old well is cursed",
                 "the gate closes at the ninth bell", "the snow will bury the trail by dawn")
_LOOT = ("wolf pelts", "iron ingots", "glowing mushrooms", "troll teeth", "bundles of reeds",
         "silver feathers", "bat wings", "jars of swamp water", "ancient runestones")
_NPC_REWARDS = ("teach you to forge a blade", "show you the hidden path", "pay you in gold",
                "tell you what happened to your father", "mend your armor for free",
                "let you sleep in the loft", "sell you my fastest horse")
_TRADES = ("ferryman", "hermit", "cartographer", "alchemist", "huntress", "innkeeper",
           "beekeeper", "stonemason")
_WILDS = ("the Whispering Fen", "the Ashen Hills", "the drowned forest", "the salt caves",
          "the northern glacier", "the old quarry", "the Glimmerdeep mines")
_TOWNS = ("Thornbury", "Kestrel Ford", "Oakhaven", "Brambleton", "Saltmere", "Highcairn",
          "Llandudno", "Machynlleth", "Wyvern's Rest")
# Customer support lines.
_SUPPORT_ITEMS = ("order", "refund", "replacement charger", "subscription", "parcel",
                  "warranty claim", "new router", "invoice", "exchange request", "gift card")
_SUPPORT_OUTCOMES = ("arrive", "be processed", "ship", "be confirmed", "appear in your account",
                     "be reviewed by our team")
_TIME_UNITS = ("business days", "hours", "working days", "minutes", "weeks")
_SUPPORT_PROBLEMS = ("the payment didn't go through", "that item is out of stock",
                     "the courier couldn't find your address", "your card has expired",
                     "the warranty ended last month", "our system is running slowly today",
                     "the discount code has already been used")
_SUPPORT_FIXES = ("I'll send you a new link right away", "I can offer you a partial refund",
                  "let me arrange a second delivery", "I've added a credit to your account",
                  "I'll escalate this to my supervisor", "we'll waive the shipping fee")
_SUPPORT_REQUESTS = ("confirm your date of birth", "spell your last name for me",
                     "read me the number on the receipt", "restart the device and try again",
                     "check your spam folder", "hold the line for a moment",
                     "describe the noise it makes", "send us a photo of the damage")
_SUPPORT_GOALS = ("change your password", "cancel your plan", "update your address",
                  "download your invoice", "pause your subscription", "pair the headphones")
_SUPPORT_STEPS = ("open the settings menu and choose security",
                  "sign in and select manage account", "hold the power button for ten seconds",
                  "visit the help page and follow the three short steps",
                  "reply to our last email with the word yes")
# Narration.
_NARRATION_OPENERS = ("Long before the war", "Just after dawn", "On the coldest night of the year",
                      "Without a word", "Years later", "In the grey light of morning",
                      "As the bells fell silent", "Against every warning")
_NARRATION_ACTIONS = ("slipped quietly out of the house", "buried the letter",
                      "waited for the tide to turn", "lit a single candle",
                      "counted the footsteps on the stairs", "stared at the empty road",
                      "whispered a name nobody else remembered", "locked the cellar door",
                      "followed the lantern light", "closed the shutters against the wind")
_ADJECTIVES = ("ancient", "narrow", "crooked", "silent", "enormous", "gloomy", "fragile",
               "gleaming", "forgotten", "weathered")
_THINGS = ("clock", "staircase", "ship", "orchard", "chapel", "telescope", "bridge", "piano",
           "windmill", "carriage")
_NARRATION_VERBS = ("creaked", "shuddered", "groaned", "glimmered", "swayed", "trembled",
                    "rattled", "hummed")
_WEATHER = ("It's pouring outside", "The forecast says hail", "There's thick fog on the motorway",
            "It's freezing this morning", "A heat wave is coming", "The wind has picked up")
_WEATHER_ADVICE = ("take the big umbrella", "leave early and drive slowly",
                   "wear your thickest gloves", "keep the windows shut",
                   "carry plenty of water", "bring the washing in")

_SLOTS = {
    "name": _NAMES, "person": _PEOPLE + _NAMES, "object": _OBJECTS, "plural": _PLURALS,
    "place": _PLACES, "time": _TIMES, "interjection": _INTERJECTIONS, "game_event": _GAME_EVENTS,
    "boss": _BOSSES, "promise": _STREAMER_PROMISES, "greeting": _NPC_GREETINGS,
    "address": _NPC_ADDRESSES, "warning": _NPC_WARNINGS, "loot": _LOOT, "reward": _NPC_REWARDS,
    "trade": _TRADES, "wild": _WILDS, "town": _TOWNS, "item": _SUPPORT_ITEMS,
    "outcome": _SUPPORT_OUTCOMES, "unit": _TIME_UNITS, "problem": _SUPPORT_PROBLEMS,
    "fix": _SUPPORT_FIXES, "request": _SUPPORT_REQUESTS, "goal": _SUPPORT_GOALS,
    "step": _SUPPORT_STEPS, "opener": _NARRATION_OPENERS, "action": _NARRATION_ACTIONS,
    "adjective": _ADJECTIVES, "thing": _THINGS, "sound": _NARRATION_VERBS, "weather": _WEATHER,
    "advice": _WEATHER_ADVICE, "month": _MONTHS,
}
_GENERATED_SLOTS = {
    "count": lambda rng: number_words(rng.choice((rng.randint(2, 20), rng.randint(21, 999),
                                                  rng.randint(1000, 99999)))),
    "few": lambda rng: number_words(rng.randint(2, 12)),
    "ordinal": lambda rng: ordinal_words(rng.randint(1, 31)),
    "clock": _clock,
    "verb": lambda rng: rng.choice(_VERBS)[0],
    "verbed": lambda rng: rng.choice(_VERBS)[1],
    "verben": lambda rng: rng.choice(_VERBS)[2],
}
_TEMPLATES = (
    # Everyday statements, questions and exclamations.
    "{person} {verbed} {object} {place} {time}.",
    "{person} will {verb} {object} {place} at {clock}.",
    "Did {person} really {verb} {object} {place}?",
    "Why would anyone {verb} {object} {time}?",
    "How many {plural} did {person} {verb} {place}?",
    "I can't believe {person} {verbed} {object} {place}!",
    "Don't forget to {verb} {object} before {clock}.",
    "We've {verben} {object} {place}, haven't we?",
    "It's already {clock}, and {person} still hasn't {verben} {object}.",
    "There were {count} {plural} {place} {time}.",
    "{name} counted {count} {plural} {place}, then counted them again.",
    "On the {ordinal} of {month}, {person} {verbed} {few} {plural}.",
    "{weather}: {advice}.",
    "{weather}, so {advice}.",
    "Where did you {verb} {object}, {name}?",
    "{interjection}, {person} just {verbed} {object}!",
    # Virtual streamer.
    "Thanks for the {few} gifted subs, {name}!",
    "Welcome to the stream, {name}; grab a snack and get comfy!",
    "Chat, did you see that {game_event}?",
    "{interjection}, that {game_event} was absolutely wild!",
    "If we beat the {boss} this time, I'll {promise}.",
    "We're only {count} followers away from the next goal, chat!",
    "Okay, chat: one more try at the {boss}, and then we'll take a break.",
    "Tonight's stream ends at {clock}, so let's make it count.",
    # Game NPC.
    "{greeting}, {address}; {warning}.",
    "{greeting}, {address}! Have you come about the {boss}?",
    "Bring me {few} {loot}, and I'll {reward}.",
    "Seek out {name} the {trade}; only they know the way through {wild}.",
    "What brings a {address} like you to {town}?",
    "They say {warning}, but I've never believed it.",
    "Beware, {address}: the {boss} stirs beneath {wild} after {clock}.",
    # Customer support.
    "Your {item} should {outcome} within {few} {unit}.",
    "I'm sorry, but {problem}; {fix}.",
    "Could you please {request}?",
    "Thank you for waiting, {name}; {fix}.",
    "To {goal}, {step}.",
    "Is there anything else I can help you with regarding your {item}?",
    "I understand, {name}, and {fix}.",
    # Audiobook narration.
    "{opener}, {person} {action} {place}.",
    "The {adjective} {thing} {sound} as {person} {action}.",
    "Nobody in {town} had ever seen {person} {verb} {object}.",
    "{opener}, the {adjective} {thing} {sound} once and then fell still.",
    "{person} had {verben} {object} {time}, and nobody ever asked why.",
)
_SLOT_PATTERN = re.compile(r"\{(\w+)\}")


def _fill(template: str, rng: random.Random) -> str:
    def draw(match: re.Match) -> str:
        slot = match.group(1)
        return _GENERATED_SLOTS[slot](rng) if slot in _GENERATED_SLOTS else rng.choice(_SLOTS[slot])

    sentence = _SLOT_PATTERN.sub(draw, template)
    return sentence[0].upper() + sentence[1:]


def generate_training_sentences(count: int = 12000, seed: int = 0) -> list[str]:
    """``count`` unique sentences, the same for the same seed on every machine."""
    held_out = {normalize(s) for name in ("eval", "calibration") for s in load_sentences(name)}
    rng = random.Random(seed)
    seen: set[str] = set()
    sentences: list[str] = []
    # Duplicates stay rarer than 1 in 2 well past 100k sentences; the bound only stops a runaway.
    attempts_left = 20 * count + 1000
    while len(sentences) < count:
        if attempts_left == 0:
            raise ValueError(f"count={count}: the grammar ran dry after {len(sentences)} unique sentences")
        attempts_left -= 1
        sentence = _fill(rng.choice(_TEMPLATES), rng)
        key = normalize(sentence)
        if key not in seen and key not in held_out:
            seen.add(key)
            sentences.append(sentence)
    return sentences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=12000, help="unique sentences to write")
    parser.add_argument("--seed", type=int, default=0, help="same seed, same sentences")
    parser.add_argument("--out", type=Path, required=True, help="text file, one sentence a line")
    args = parser.parse_args()
    sentences = generate_training_sentences(args.count, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # Temp file in the same folder, then os.replace: a reader never sees a half-written file.
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=args.out.parent,
                                     suffix=".tmp", delete=False) as tmp_file:
        tmp_file.write("\n".join(sentences) + "\n")
    os.replace(tmp_file.name, args.out)
    print(f"wrote {len(sentences)} sentences to {args.out}")


if __name__ == "__main__":
    main()
