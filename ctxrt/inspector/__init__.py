"""``ctxrt serve``: a read-only web inspector of a store (docs/inspector.md).

``pages`` reads what each page shows (no web framework); ``app`` is the Starlette app and its
Hypercorn server, imported only when serving (``pip install 'ctxrt[inspector]'``).
"""
