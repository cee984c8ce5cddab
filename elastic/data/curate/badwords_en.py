"""The shipped English word list of the toxicity stage: profanity and slurs, in the spirit of
LDNOOBW's list and much shorter. A Python module rather than a data file so that it ships with
every install of the package (`pip install .` copies only modules); `curate.toxic_words` points
at a text file (one lower-case word or phrase per line) to use another list."""

WORDS = """
asshole
assholes
bitch
bitches
bullshit
cocksucker
cunt
cunts
dickhead
faggot
fuck
fucked
fucker
fuckers
fucking
fucks
motherfucker
nigger
pussy
retard
shit
shits
shitty
slut
sluts
twat
wanker
whore
whores
""".split("\n")
