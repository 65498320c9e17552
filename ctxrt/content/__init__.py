"""Content: blocks and messages, the checks of what a host hands in, their storage form,
media kept once (blobs) and token estimates.
"""
