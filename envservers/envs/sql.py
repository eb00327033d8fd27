"""`sql`: questions over a read-only SQLite database, one per task.

The row says where the database is (`extra_info`):

    "db_path": "/data/shop.sqlite"        opened read-only (SQLite URI mode=ro), or
    "db_sql": "CREATE TABLE ...; INSERT ..."  built in memory, then locked read-only

Tools: `list_tables()`, `describe(table)`, `execute_sql(query)`. Writes are refused by an
authorizer (only reads, SELECT and functions pass) and `PRAGMA query_only`, on a connection
opened read-only (the path is URI-quoted, so it cannot smuggle in `mode=rw`); a query running
longer than `query_timeout_s` is interrupted; no string or blob may exceed `max_value_bytes`
(SQLITE_LIMIT_LENGTH) and no more rows are fetched than can be shown or scored, so a query
cannot fill the server's memory. The final `<answer>` is a SQL query: reward 1.0
when its result set equals the ground truth's — `reward_spec.ground_truth` is a SQL query
run on the same database or a list of rows — compared as multisets of rows (row order
ignored, floats rounded to 6 places), subject to must_call_tool / tool_sequence.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import urllib.parse
from collections import Counter
from typing import Any

from envservers import rewards
from envservers.config import EnvServerConfig, SqlConfig
from envservers.tool_env import ToolEnv
from envservers.tools import Tool, ToolError, ToolGroup
from envservers.types import EnvProvider

_ALLOWED_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE,
}
_NO_ARGS = {"type": "object", "properties": {}}


def _authorize(action: int, *_args: Any) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def open_database(extra_info: dict[str, Any], *, max_value_bytes: int) -> sqlite3.Connection:
    """A read-only connection to the task's database; ValueError if the row names none."""
    if isinstance(extra_info.get("db_path"), str):
        # Quoted, so a path holding "?" or "#" cannot add URI parameters (e.g. mode=rw).
        uri = f"file:{urllib.parse.quote(extra_info['db_path'])}?mode=ro"
        try:
            conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as e:
            raise ValueError(f"task.extra_info.db_path: cannot open read-only: {e}") from e
    elif isinstance(extra_info.get("db_sql"), str):
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        try:
            conn.executescript(extra_info["db_sql"])
        except sqlite3.Error as e:
            raise ValueError(f"task.extra_info.db_sql: {e}") from e
    else:
        raise ValueError("task.extra_info: needs db_path (a SQLite file) or db_sql (a script)")
    conn.execute("PRAGMA query_only = ON")
    conn.set_authorizer(_authorize)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value_bytes)
    return conn


def normalize_rows(rows: list[Any]) -> Counter:
    """Rows as a multiset of tuples; floats rounded so 0.1+0.2 equals 0.3."""

    def cell(v: Any) -> Any:
        return round(v, 6) if isinstance(v, float) else v

    return Counter(
        tuple(cell(v) for v in (row if isinstance(row, list | tuple) else [row])) for row in rows
    )


class SqlEnv(ToolEnv):
    def __init__(self, config: SqlConfig, **kwargs: Any):
        super().__init__(**kwargs)
        self.config = config
        self.conn: sqlite3.Connection | None = None

    def _query(
        self, sql: str, params: tuple = (), *, max_rows: int | None = None
    ) -> tuple[list[str], list[tuple]]:
        """Columns and rows (at most `max_rows` of them: the rest are never fetched)."""
        assert self.conn is not None
        deadline = time.monotonic() + self.config.query_timeout_s
        self.conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        try:
            cursor = self.conn.execute(sql, params)
            rows = cursor.fetchall() if max_rows is None else cursor.fetchmany(max_rows)
        except sqlite3.OperationalError as e:
            if "interrupted" in str(e):
                raise ToolError(f"query took longer than {self.config.query_timeout_s}s") from e
            raise ToolError(f"sql error: {e}") from e
        except sqlite3.Error as e:
            raise ToolError(f"sql error: {e}") from e
        finally:
            self.conn.set_progress_handler(None, 0)
        columns = [d[0] for d in cursor.description or []]
        return columns, rows

    async def query(
        self, sql: str, params: tuple = (), *, max_rows: int | None = None
    ) -> tuple[list[str], list[tuple]]:
        return await asyncio.to_thread(self._query, sql, params, max_rows=max_rows)

    async def execute_sql(self, query: str) -> str:
        columns, rows = await self.query(query, max_rows=self.config.max_rows + 1)
        shown = rows[: self.config.max_rows]
        lines = [" | ".join(columns)] + [" | ".join(map(str, r)) for r in shown]
        if len(rows) > len(shown):
            lines.append(f"... (more than {len(shown)} rows, {len(shown)} shown)")
        return "\n".join(lines) if columns else "(no rows)"

    async def list_tables(self) -> str:
        _, rows = await self.query(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        )
        return "\n".join(r[0] for r in rows)

    async def describe(self, table: str) -> str:
        _, rows = await self.query(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        )
        if not rows:
            raise ToolError(f"no table named {table!r}")
        return rows[0][0]

    async def make_tools(self, task: dict[str, Any]) -> ToolGroup:
        self.conn = await asyncio.to_thread(
            open_database,
            task.get("extra_info") or {},
            max_value_bytes=self.config.max_value_bytes,
        )
        truth = (task.get("reward_spec") or {}).get("ground_truth")
        if not isinstance(truth, str | list):
            raise ValueError("task.reward_spec.ground_truth: a SQL query or a list of rows")
        if isinstance(truth, str):
            try:
                _, truth = await self.query(truth)
            except ToolError as e:
                raise ValueError(f"task.reward_spec.ground_truth: {e}") from e
        self.expected = normalize_rows(truth)
        one_string = {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "one SQLite SELECT"}},
            "required": ["query"],
        }
        table = {
            "type": "object",
            "properties": {"table": {"type": "string"}},
            "required": ["table"],
        }
        return ToolGroup(
            [
                Tool("list_tables", "List the tables of the database.", _NO_ARGS, self.list_tables),
                Tool("describe", "Show the CREATE statement of a table.", table, self.describe),
                Tool(
                    "execute_sql",
                    "Run a read-only SQL query; returns the rows.",
                    one_string,
                    self.execute_sql,
                ),
            ]
        )

    def reward_rules(self, reward_spec: dict[str, Any] | None) -> rewards.RewardRules:
        # ground_truth is a query or rows, compared by result set (not as an answer string)
        spec = {k: v for k, v in (reward_spec or {}).items() if k != "ground_truth"}
        return rewards.rules_from_spec(spec)

    async def score_answer(self, answer: str) -> float:
        try:  # one row more than expected is enough to know it is wrong
            _, rows = await self.query(answer, max_rows=sum(self.expected.values()) + 1)
        except ToolError:
            return 0.0
        if normalize_rows(rows) != self.expected:
            return 0.0
        return 1.0 if rewards.tool_rules_hold(self.rules, self.successful_calls) else 0.0

    async def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class SqlProvider(EnvProvider):
    description = "read-only SQLite per task; reward by comparing result sets"

    def __init__(self, config: EnvServerConfig):
        self.config = config

    def make(self) -> SqlEnv:
        return SqlEnv(self.config.sql, **self.config.tool_rules)


def build_provider(config: EnvServerConfig) -> SqlProvider:
    return SqlProvider(config)
