"""Agent workflows the tests run on env servers, written as users write them: plain `openai`
calls, a score at the end. Each is named by import path (`tests.agents.workflows:NAME`)."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from demo.data import DEMO_TOOLS

ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S)


def _score(text: str | None, task: dict[str, Any]) -> float:
    found = ANSWER.search(text or "")
    truth = task["reward_spec"]["ground_truth"]
    try:
        return float(found is not None and float(found.group(1)) == float(truth))
    except ValueError:
        return 0.0


async def calculator(client, task: dict[str, Any], max_turns: int = 4) -> float:
    """The calculator task as an agent loop: call, run the `add` tool it asks for, repeat."""
    messages = list(task["prompt"])
    for _ in range(max_turns):
        completion = await client.chat.completions.create(
            model="policy", messages=messages, tools=DEMO_TOOLS
        )
        reply = completion.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            args = json.loads(call.function.arguments)
            total = args.get("a", 0) + args.get("b", 0)
            result = str(int(total)) if float(total).is_integer() else str(total)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return _score(reply.content, task)


async def with_components(client, task: dict[str, Any]) -> dict[str, float]:
    """One call; the reward and two named components."""
    completion = await client.chat.completions.create(model="policy", messages=task["prompt"])
    text = completion.choices[0].message.content or ""
    correct = _score(text, task)
    return {"reward": correct, "correct": correct, "length": float(len(text))}


async def solver_and_critic(client, task: dict[str, Any]) -> float:
    """Two roles in one episode: a solver, then a critic that sees only the answer."""
    first = await client.chat.completions.create(model="policy", messages=task["prompt"])
    answer = first.choices[0].message.content or ""
    critique = [{"role": "user", "content": f"Is this right? {answer}"}]
    await client.chat.completions.create(model="policy", messages=critique)
    return _score(answer, task)


async def raises(client, task: dict[str, Any]) -> float:
    await client.chat.completions.create(model="policy", messages=task["prompt"])
    raise RuntimeError("the agent's own bug")


async def hangs(client, task: dict[str, Any]) -> float:
    await client.chat.completions.create(model="policy", messages=task["prompt"])
    await asyncio.sleep(3600)
    return 1.0


async def says_yes(client, task: dict[str, Any]) -> str:
    await client.chat.completions.create(model="policy", messages=task["prompt"])
    return "yes"


async def never_calls(client, task: dict[str, Any]) -> float:
    return 1.0


LEFTOVER: list[Any] = []


async def calls_after_its_end(client, task: dict[str, Any]) -> float:
    """Finishes, leaving a call behind that reaches the endpoint once the episode ended."""
    await client.chat.completions.create(model="policy", messages=task["prompt"])

    import openai

    again = openai.AsyncOpenAI(base_url=str(client.base_url), api_key=client.api_key, max_retries=0)

    async def late():
        await asyncio.sleep(0.3)
        try:
            await again.chat.completions.create(model="policy", messages=task["prompt"])
        except Exception as e:  # noqa: BLE001 (what the endpoint answered is the point)
            LEFTOVER.append(e)

    LEFTOVER.append(asyncio.get_running_loop().create_task(late()))
    return 1.0


async def calculator_raw(client, task: dict[str, Any], max_turns: int = 4) -> float:
    """`calculator` over plain HTTP (for measuring what the openai client costs)."""
    http = client._client
    headers = {"Authorization": f"Bearer {client.api_key}"}
    messages = list(task["prompt"])
    for _ in range(max_turns):
        body = {"model": "policy", "messages": messages, "tools": DEMO_TOOLS}
        response = await http.post(f"{client.base_url}chat/completions", json=body, headers=headers)
        reply = response.json()["choices"][0]["message"]
        messages.append(reply)
        if not reply.get("tool_calls"):
            break
        for call in reply["tool_calls"]:
            args = json.loads(call["function"]["arguments"])
            total = args.get("a", 0) + args.get("b", 0)
            result = str(int(total)) if float(total).is_integer() else str(total)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return _score(reply.get("content"), task)
