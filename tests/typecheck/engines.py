"""Both engines implement the engine interface (mypy checks these assignments)."""

from ctxrt.store.engine import Engine
from ctxrt.store.interface import StoreEngine
from ctxrt.store.postgres import PostgresEngine


def lmdb_engine(engine: Engine) -> StoreEngine:
    return engine


def postgres_engine(engine: PostgresEngine) -> StoreEngine:
    return engine
