"""arq behind one door: the worker assembly, the one-script claim and the wake-up pickup (the only importers of arq)."""
