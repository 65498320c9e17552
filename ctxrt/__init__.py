"""ctxrt: a context runtime for multi-agent LLM hosts, on trio and LMDB.

This module re-exports the public names (docs/api.md) and defines nothing.
"""

from .compile import (
    Budget as Budget,
    CompileResult as CompileResult,
    Entry as Entry,
    Injection as Injection,
    MessageInjection as MessageInjection,
    PreviewResult as PreviewResult,
    Provenance as Provenance,
    Source as Source,
)
from .content import (
    CompiledMessage as CompiledMessage,
    Document as Document,
    Image as Image,
    Message as Message,
    RedactedThinking as RedactedThinking,
    Text as Text,
    Thinking as Thinking,
    ToolResult as ToolResult,
    ToolUse as ToolUse,
    content_for_reader as content_for_reader,
)
from .errors import (
    BranchExistsError as BranchExistsError,
    BranchNotFoundError as BranchNotFoundError,
    ConfigConflictError as ConfigConflictError,
    CtxrtError as CtxrtError,
    EmptyRequestError as EmptyRequestError,
    InvalidRequestError as InvalidRequestError,
    MalformedContentError as MalformedContentError,
    ManagerClosedError as ManagerClosedError,
    MessageNotFoundError as MessageNotFoundError,
    ModelError as ModelError,
    NarrowingRefusedError as NarrowingRefusedError,
    NotTrioError as NotTrioError,
    OverBudgetError as OverBudgetError,
    ReaderConflictError as ReaderConflictError,
    ReadOnlyStoreError as ReadOnlyStoreError,
    RuntimeClosedError as RuntimeClosedError,
    StateKindError as StateKindError,
    StoreCorruptError as StoreCorruptError,
    StoreFormatError as StoreFormatError,
    StoreFullError as StoreFullError,
    StoreLockedError as StoreLockedError,
    StorePermissionError as StorePermissionError,
    StrategyRefusedError as StrategyRefusedError,
    UnknownStateError as UnknownStateError,
)
from .manager import ContextManager as ContextManager, Derivation as Derivation, MessageWindow as MessageWindow
from .model import (
    AnthropicModel as AnthropicModel,
    Model as Model,
    ModelRequest as ModelRequest,
    ModelResponse as ModelResponse,
    OfflineModel as OfflineModel,
    Usage as Usage,
)
from .namespace.protocol import NamespaceHealth as NamespaceHealth
from .namespace.registry import NamespaceStatistics as NamespaceStatistics
from .runtime import (
    NamespaceInfo as NamespaceInfo,
    Runtime as Runtime,
    RuntimeStatistics as RuntimeStatistics,
    open_runtime as open_runtime,
)
from .store.protocol import BranchInfo as BranchInfo
from .strategies.autobiographical import (
    Autobiographical as Autobiographical,
    Summary as Summary,
    SummaryMatch as SummaryMatch,
)
from .strategies.base import (
    Backlog as Backlog,
    HeadWindowReset as HeadWindowReset,
    RenderStats as RenderStats,
    SelectOptions as SelectOptions,
    Strategy as Strategy,
    StrategyConfig as StrategyConfig,
    StrategyContext as StrategyContext,
    SummaryReader as SummaryReader,
    Unit as Unit,
)
from .strategies.knowledge import Knowledge as Knowledge
from .strategies.passthrough import Passthrough as Passthrough
from .strategies.windowed import WindowedPassthrough as WindowedPassthrough
from .views import MessageView as MessageView
from .views import Window as Window
