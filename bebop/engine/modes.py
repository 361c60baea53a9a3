"""The generation modes, named once (no torch: the command line's parser reads them): `ar` plain sampling,
`spec` speculative sampling (drafts sampled from the draft's distribution), `spec-greedy` (the draft's argmax)."""

MODES = ("ar", "spec", "spec-greedy")
