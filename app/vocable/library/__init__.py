"""The library layer: what the app keeps on disk for the user.

`voice` is the voice file (a speaker embedding and, for in-context cloning, the reference's codes
and transcript); `voices` the library of named voices; `history` past generations with their
audio; `settings` the app's settings; `paths` where all of it lives. Nothing here runs the engine.
"""
