"""The compile (docs/behaviours.md P2-P7): a strategy's entries turned into a
``CompileResult``: mixed tool messages split and pairs repaired, cache breakpoints,
injections placed, provenance attached.
"""
