"""Models: the ``Model`` protocol, and the Anthropic, OpenAI and offline models a strategy
compresses through.
"""
