"""ctxrt: a context runtime for multi-agent LLM hosts, on trio and LMDB.

This module re-exports the public names (docs/api.md) and defines nothing.
"""

from .branching import Derivation as Derivation
from .compile.result import CompileResult as CompileResult
from .content.blocks import (
    Audio as Audio,
)
from .content.blocks import (
    Block as Block,
)
from .content.blocks import (
    CompiledMessage as CompiledMessage,
)
from .content.blocks import (
    ContentLike as ContentLike,
)
from .content.blocks import (
    Document as Document,
)
from .content.blocks import (
    GeneratedImage as GeneratedImage,
)
from .content.blocks import (
    Image as Image,
)
from .content.blocks import (
    Message as Message,
)
from .content.blocks import (
    RedactedThinking as RedactedThinking,
)
from .content.blocks import (
    Text as Text,
)
from .content.blocks import (
    Thinking as Thinking,
)
from .content.blocks import (
    ToolAttempt as ToolAttempt,
)
from .content.blocks import (
    ToolNotice as ToolNotice,
)
from .content.blocks import (
    ToolResult as ToolResult,
)
from .content.blocks import (
    ToolUse as ToolUse,
)
from .content.blocks import (
    Video as Video,
)
from .content.blocks import (
    content_for_reader as content_for_reader,
)
from .errors import (
    BranchExistsError as BranchExistsError,
)
from .errors import (
    BranchNotFoundError as BranchNotFoundError,
)
from .errors import (
    ConfigConflictError as ConfigConflictError,
)
from .errors import (
    CtxrtError as CtxrtError,
)
from .errors import (
    EmptyRequestError as EmptyRequestError,
)
from .errors import (
    InvalidRequestError as InvalidRequestError,
)
from .errors import (
    MalformedContentError as MalformedContentError,
)
from .errors import (
    LedgerOffError as LedgerOffError,
)
from .errors import (
    ManagerClosedError as ManagerClosedError,
)
from .errors import (
    MessageNotFoundError as MessageNotFoundError,
)
from .errors import (
    ModelError as ModelError,
)
from .errors import (
    NarrowingRefusedError as NarrowingRefusedError,
)
from .errors import (
    NotTrioError as NotTrioError,
)
from .errors import (
    OverBudgetError as OverBudgetError,
)
from .errors import (
    ReaderConflictError as ReaderConflictError,
)
from .errors import (
    ReadOnlyStoreError as ReadOnlyStoreError,
)
from .errors import (
    RuntimeClosedError as RuntimeClosedError,
)
from .errors import (
    StateKindError as StateKindError,
)
from .errors import (
    StoreCorruptError as StoreCorruptError,
)
from .errors import (
    StoreFormatError as StoreFormatError,
)
from .errors import (
    StoreFullError as StoreFullError,
)
from .errors import (
    StoreLockedError as StoreLockedError,
)
from .errors import (
    StorePermissionError as StorePermissionError,
)
from .errors import (
    StoreUnavailableError as StoreUnavailableError,
)
from .errors import (
    StoreUnsupportedError as StoreUnsupportedError,
)
from .errors import (
    StrategyRefusedError as StrategyRefusedError,
)
from .errors import (
    UnknownStateError as UnknownStateError,
)
from .events import Added as Added
from .events import Edited as Edited
from .events import MessageEvent as MessageEvent
from .events import QuarantineAlarm as QuarantineAlarm
from .events import Removed as Removed
from .compile.injections import Injection as Injection
from .compile.injections import MessageInjection as MessageInjection
from .host_state import HostEntry as HostEntry
from .host_state import HostState as HostState
from .manager import ContextManager as ContextManager
from .manager import MessageWindow as MessageWindow
from .queries import ChannelTokens as ChannelTokens
from .models.model import (
    AnthropicModel as AnthropicModel,
)
from .models.model import (
    Model as Model,
)
from .models.model_types import (
    ModelRequest as ModelRequest,
)
from .models.model_types import (
    ModelResponse as ModelResponse,
)
from .models.model import (
    OfflineModel as OfflineModel,
)
from .models.model_types import (
    Usage as Usage,
)
from .namespace.protocol import NamespaceHealth as NamespaceHealth
from .namespace.protocol import CompileMetadata as CompileMetadata
from .namespace.protocol import CompressionHold as CompressionHold
from .namespace.protocol import NamespaceSnapshot as NamespaceSnapshot
from .models.openai_model import OpenAIModel as OpenAIModel
from .forms.openai_wire import OpenAIBody as OpenAIBody
from .namespace.registry import NamespaceStatistics as NamespaceStatistics
from .compile.provenance import Provenance as Provenance
from .compile.provenance import Source as Source
from .request_ledger import HeldItem as HeldItem
from .request_ledger import RebuiltRequest as RebuiltRequest
from .request_ledger import RequestPart as RequestPart
from .request_ledger import RequestRecord as RequestRecord
from .request_ledger import RequestUsage as RequestUsage
from .runtime import (
    NamespaceInfo as NamespaceInfo,
)
from .runtime import (
    Runtime as Runtime,
)
from .runtime import (
    RuntimeStatistics as RuntimeStatistics,
)
from .runtime import (
    open_runtime as open_runtime,
)
from .budget import Budget as Budget
from .budget import Entry as Entry
from .budget import PreviewResult as PreviewResult
from .store.protocol import BranchInfo as BranchInfo
from .strategies.autobiographical import (
    Autobiographical as Autobiographical,
)
from .strategies.base import (
    Backlog as Backlog,
)
from .strategies.base import (
    HeadWindowReset as HeadWindowReset,
)
from .strategies.base import (
    Pin as Pin,
)
from .strategies.base import (
    Pinning as Pinning,
)
from .strategies.base import (
    RenderStats as RenderStats,
)
from .strategies.base import (
    SelectOptions as SelectOptions,
)
from .strategies.base import (
    Strategy as Strategy,
)
from .strategies.base import (
    StrategyConfig as StrategyConfig,
)
from .strategies.base import (
    StrategyContext as StrategyContext,
)
from .strategies.base import (
    SummaryReader as SummaryReader,
)
from .strategies.base import (
    Unit as Unit,
)
from .strategies.knowledge import Knowledge as Knowledge
from .strategies.passthrough import Passthrough as Passthrough
from .strategies.records import Summary as Summary
from .strategies.records import SummaryMatch as SummaryMatch
from .strategies.settings import ContextSettings as ContextSettings
from .strategies.windowed import WindowedPassthrough as WindowedPassthrough
from .content.tokens import CalibratedEstimator as CalibratedEstimator
from .content.tokens import TokenEstimator as TokenEstimator
from .views import MessageView as MessageView
from .views import Window as Window
