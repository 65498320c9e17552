"""The public surface: every name API.md promises is importable from ``ctxrt``, and the facade
defines nothing of its own (it only re-exports)."""

import inspect

import ctxrt
import ctxrt.testing

API_NAMES = """
open_runtime Runtime ContextManager Message Text Thinking RedactedThinking Image Document ToolUse ToolResult
content_for_reader CompiledMessage Budget Injection MessageInjection CompileResult PreviewResult Provenance
Passthrough WindowedPassthrough Autobiographical Knowledge Strategy StrategyContext Model ModelRequest ModelResponse
Usage AnthropicModel OpenAIModel OpenAIBody OfflineModel BranchInfo Derivation
CtxrtError MalformedContentError ReaderConflictError NarrowingRefusedError StrategyRefusedError ConfigConflictError
MessageNotFoundError BranchNotFoundError BranchExistsError ManagerClosedError StoreLockedError ReadOnlyStoreError
OverBudgetError ModelError
""".split()


def test_every_name_api_md_promises_is_importable_from_ctxrt() -> None:
    """API.md: each public name resolves on the package."""
    missing = [name for name in API_NAMES if not hasattr(ctxrt, name)]
    assert missing == []
    assert callable(ctxrt.testing.ScriptedModel)
    assert callable(ctxrt.testing.open_openai_api_server)


def test_the_facade_defines_nothing_of_its_own() -> None:
    """Style: ctxrt/__init__.py re-exports; every public object it holds comes from a submodule."""
    own = [
        name for name, value in vars(ctxrt).items()
        if not name.startswith("_") and not inspect.ismodule(value) and getattr(value, "__module__", "") == "ctxrt"
    ]
    assert own == []


def test_errors_keep_the_contracted_hierarchy() -> None:
    """API.md §Errors: the tree and its builtin second bases, so hosts can catch by kind."""
    assert issubclass(ctxrt.MalformedContentError, ValueError)
    assert issubclass(ctxrt.MessageNotFoundError, KeyError)
    assert issubclass(ctxrt.BranchNotFoundError, KeyError)
    for name in API_NAMES:
        value = getattr(ctxrt, name)
        if name.endswith("Error") and name != "CtxrtError":
            assert issubclass(value, ctxrt.CtxrtError), name
    assert ctxrt.MalformedContentError("content[2].source.media_type", "bad").path == "content[2].source.media_type"
    assert ctxrt.OverBudgetError("too big", budget=10, actual=20).actual == 20
    assert ctxrt.ModelError("x", retryable=True).retryable
