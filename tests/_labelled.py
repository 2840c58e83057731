"""A small labelled corpus for deciding from labels through the adapters (issue 50): eight questions, each
answered by one passage of a 24-passage corpus that a lexical retriever finds among its top 5 with four others."""

from __future__ import annotations

TOPICS = {
    "fleas": ("how long do fleas live", "An adult flea lives two to three months, up to a year with a steady host."),
    "tower": ("how tall is the eiffel tower", "The Eiffel Tower in Paris is 330 metres tall since its new antenna."),
    "honey": ("why does honey never spoil", "Honey never spoils because its low water and high acidity stop bacteria."),
    "octopus": ("how many hearts does an octopus have", "An octopus has three hearts: two pump blood to the gills."),
    "venus": ("how long is a day on venus", "A day on Venus lasts longer than its year: 243 Earth days per turn."),
    "bamboo": ("how fast does bamboo grow", "Some bamboo grows almost a metre in a single day, the fastest plant."),
    "salt": ("why is the sea salty", "The sea is salty because rivers carry minerals from rocks into the sea."),
    "owls": ("can owls turn their heads all the way", "Owls turn their heads 270 degrees thanks to extra neck bones."),
}
# two distractors per topic: they share the question's words, not its answer
DISTRACTORS = {
    "fleas": ("Fleas are wingless insects; how they live on cats and dogs is a long story.",
              "A flea can jump long distances, how far depends on the flea."),
    "tower": ("The Eiffel Tower is painted every seven years; how tall the ladders are is not said.",
              "Paris has many towers; the eiffel one is the most visited."),
    "honey": ("Honey bees make honey from nectar; why bees dance is another question.",
              "Honey is sweeter than sugar and does spoil a cake if you use too much."),
    "octopus": ("An octopus has eight arms and many suckers on each of them.",
                "How many octopus species are there? About three hundred."),
    "venus": ("Venus is the hottest planet; a long day of sun would not cool it.",
              "A day at the beach on Venus is impossible: the air is acid."),
    "bamboo": ("Bamboo is a grass; how fast pandas eat it is well studied.",
               "Does bamboo grow in Europe? It grows in gardens there."),
    "salt": ("Salt is used to season food; why is table salt iodised?",
             "The Dead Sea is salty enough to float on; the sea there is a lake."),
    "owls": ("Owls hunt at night and their heads hold large eyes.",
             "Can owls see in daylight? They can, all the way to the horizon."),
}


def corpus() -> dict[str, str]:
    """id -> text: the answers ``{topic}-a``, the distractors ``{topic}-0`` and ``{topic}-1``."""
    out = {f"{t}-a": answer for t, (_, answer) in TOPICS.items()}
    out.update({f"{t}-{i}": d for t, ds in DISTRACTORS.items() for i, d in enumerate(ds)})
    return out


def questions() -> dict[str, str]:
    return {f"q-{t}": q for t, (q, _) in TOPICS.items()}


def relevant() -> dict[str, list[str]]:
    return {f"q-{t}": [f"{t}-a"] for t in TOPICS}
