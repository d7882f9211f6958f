"""Where downloaded bytes end up: files (``.part`` + rename), tar shards, memory.

:mod:`swarmget.sinks.naming` decides the relative output path of each row and
keeps every path inside the output directory.
"""
