"""Word pools for the fictional encyclopedia's names.

Pools are shared on purpose so that names collide partially (two people with the same first name, a company
named after a person's surname, a band and a film sharing an adjective, a university named after its city):
those near-misses are the confusable distractors a searching agent must tell apart.
"""

from __future__ import annotations

FIRST_NAMES = (
    "Arlen", "Bria", "Cato", "Dara", "Edwin", "Fiona", "Galen", "Hilda", "Ivor", "Jana", "Kellan", "Liora",
    "Marek", "Nadia", "Orrin", "Petra", "Quinn", "Rosa", "Soren", "Talia", "Ulric", "Vera", "Wren", "Xander",
    "Yara", "Zoltan", "Anika", "Bram", "Celia", "Dorian", "Elsa", "Felix", "Greta", "Hugo", "Ines", "Jonah",
    "Kira", "Lucan", "Mila", "Nils",
)
LAST_NAMES = (
    "Voss", "Halden", "Marrow", "Quist", "Ferro", "Lindqvist", "Oakes", "Pryor", "Rask", "Sable", "Thorne",
    "Ulven", "Varga", "Wexley", "Yarrow", "Zeller", "Ashby", "Brandt", "Corvin", "Dunmore", "Ellery", "Fairlie",
    "Gorski", "Holt", "Ibsen", "Jessup", "Kerrigan", "Lorne", "Mendel", "Norcross", "Orlov", "Penhale", "Rhee",
    "Stroud", "Tamsin", "Vance", "Whitlock", "Achter", "Bellamy", "Crane",
)
CITY_PREFIXES = (
    "Mor", "Tess", "Kal", "Vel", "Brin", "Ost", "Lum", "Dray", "Fen", "Quill", "Ash", "Cor", "Eld", "Hal",
    "Jas", "Kor", "Lan", "Mir", "Nor", "Pell", "Rav", "Sil", "Tor", "Wyn",
)
CITY_SUFFIXES = ("vale", "bury", "ford", "haven", "mouth", "stead", "wick", "ton", "port", "holm")
COUNTRIES = (
    "Kaldoria", "Vesmark", "Oranthia", "Belravia", "Tyrnland", "Zephora", "Quorvia", "Ulmaris", "Dravonia",
    "Sylvara", "Merenth", "Astoria", "Caldera", "Norvath", "Elbria", "Galmora",
)
ADJECTIVES = (
    "Crimson", "Silent", "Golden", "Hollow", "Iron", "Velvet", "Broken", "Silver", "Distant", "Frozen",
    "Hidden", "Lonely", "Burning", "Emerald", "Quiet", "Scarlet", "Wandering", "Fading", "Electric", "Wild",
    "Bitter", "Endless", "Paper", "Crystal",
)
FILM_NOUNS = (
    "Harbor", "Garden", "Horizon", "Mirror", "Orchard", "Lantern", "Valley", "River", "Tower", "Letter",
    "Winter", "Island", "Bridge", "Forest", "Signal", "Station", "Summer", "Kingdom", "Canyon", "Shadow",
    "Meadow", "Compass", "Voyage", "Echo",
)
BAND_NOUNS = (
    "Wolves", "Ravens", "Foxes", "Sparrows", "Tigers", "Owls", "Hounds", "Falcons", "Herons", "Lions",
    "Moths", "Otters", "Vipers", "Crows", "Stags", "Bees",
)
COMPANY_SUFFIXES = (
    "Dynamics", "Works", "Industries", "Labs", "Systems", "Foods", "Motors", "Media", "Textiles", "Shipping",
)
