"""The `sql` environment through a real server: read-only databases per task, tools,
result-set rewards, refused writes and interrupted runaway queries."""

import json
import sqlite3

import grpc
import pytest

SCHEMA = """
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT, total REAL);
INSERT INTO orders VALUES (1, 'ann', 10.5), (2, 'bob', 20.0), (3, 'ann', 4.5);
"""


def _task(**extra_info):
    return {
        "data_source": "shop",
        "env_class": "sql",
        "prompt": [{"role": "user", "content": "Total spent per customer?"}],
        "reward_spec": {
            "method": "rule",
            "ground_truth": "SELECT customer, SUM(total) FROM orders GROUP BY 1",
        },
        "extra_info": extra_info or {"db_sql": SCHEMA},
    }


def _sql(query: str) -> str:
    call = {"name": "execute_sql", "arguments": {"query": query}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


async def test_tools_and_result_set_reward(client):
    session = await client.open("sql", _task())
    names = [t["function"]["name"] for t in session.observation.tools]
    assert names == ["list_tables", "describe", "execute_sql"]
    tables = await session.step('<tool_call>{"name": "list_tables", "arguments": {}}</tool_call>')
    assert tables.observations[0]["content"] == "orders"
    rows = await session.step(_sql("SELECT customer, total FROM orders ORDER BY id"))
    assert rows.observations[0]["content"] == "customer | total\nann | 10.5\nbob | 20.0\nann | 4.5"
    # same multiset of rows, different order and spelling: full reward
    final = await session.step(
        "<answer>SELECT customer, SUM(total) AS s FROM orders GROUP BY customer ORDER BY s DESC"
        "</answer>"
    )
    assert (final.reward, final.done) == (1.0, True)


@pytest.mark.parametrize(
    "answer",
    ["SELECT customer, MAX(total) FROM orders GROUP BY 1", "SELECT nonsense", "DROP TABLE orders"],
)
async def test_wrong_or_broken_answers_score_zero(client, answer):
    session = await client.open("sql", _task())
    assert (await session.step(f"<answer>{answer}</answer>")).reward == 0.0


@pytest.mark.parametrize(
    "query",
    [
        "DELETE FROM orders",
        "INSERT INTO orders VALUES (9, 'eve', 1)",
        "CREATE TABLE t (x)",
        "PRAGMA query_only = OFF",
        "ATTACH DATABASE '/etc/passwd' AS p",
    ],
)
async def test_writes_and_escapes_are_refused(client, query):
    session = await client.open("sql", _task())
    result = await session.step(_sql(query))
    assert result.observations[0]["content"].startswith("error: sql error: not authorized")
    count = await session.step(_sql("SELECT COUNT(*) FROM orders"))
    assert count.observations[0]["content"].endswith("\n3")


async def test_runaway_query_is_interrupted(client):
    session = await client.open("sql", _task())
    forever = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT MAX(x) FROM c"
    result = await session.step(_sql(forever))
    assert "query took longer than" in result.observations[0]["content"]


async def test_db_file_opened_read_only_and_ground_truth_rows(client, tmp_path):
    path = tmp_path / "shop.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA)
    task = _task(db_path=str(path))
    task["reward_spec"]["ground_truth"] = [["ann", 15.0], ["bob", 20.0]]
    session = await client.open("sql", task)
    final = await session.step(
        "<answer>SELECT customer, SUM(total) FROM orders GROUP BY customer</answer>"
    )
    assert final.reward == 1.0


async def test_bad_database_is_invalid_argument(client):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.open("sql", _task(db_path="/nonexistent/x.sqlite"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "db_path" in info.value.details()


async def test_the_database_file_is_never_written(client, tmp_path):
    path = tmp_path / "shop.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    session = await client.open("sql", _task(db_path=str(path)))
    for query in (
        "DELETE FROM orders",
        "UPDATE orders SET total = 0",
        "DROP TABLE orders",
        "PRAGMA query_only = OFF",
        "VACUUM",
        "PRAGMA journal_mode = DELETE",
        f"ATTACH DATABASE '{tmp_path / 'new.sqlite'}' AS n",
    ):
        content = (await session.step(_sql(query))).observations[0]["content"]
        assert content in (
            "error: sql error: not authorized",
            "error: sql error: authorization denied",  # VACUUM's wording
        ), (query, content)
    await session.step("<answer>DELETE FROM orders</answer>")  # the answer is a query too
    await session.close()
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert not (tmp_path / "new.sqlite").exists()


async def test_a_path_cannot_smuggle_in_uri_parameters(client, tmp_path):
    path = tmp_path / "shop.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA)
    with pytest.raises(grpc.aio.AioRpcError) as info:  # read as a file name, which is absent
        await client.open("sql", _task(db_path=f"{path}?mode=rw&cache=shared"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_huge_values_and_results_never_reach_memory(client):
    session = await client.open("sql", _task())
    huge = await session.step(_sql("SELECT hex(randomblob(300000000))"))  # 600 MB of text
    assert huge.observations[0]["content"] == "error: sql error: string or blob too big"
    many = await session.step(
        _sql("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c")
    )
    content = many.observations[0]["content"]
    assert content.endswith("... (more than 50 rows, 50 shown)")  # fetched 51, not billions
