"""`vocable bench`: the engine's speed and agreement with the official package, stage by stage."""
