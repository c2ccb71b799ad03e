"""Drive `doorbell a2a serve` with the official A2A SDK (a2a-sdk 1.1.x, whose JSON-RPC client
parses every result strictly), as a remote caller `design` of the station `web`; the station's
side answers with the real `doorbell reply`. Prints what it saw as one JSON document.

Usage: a2a_client.py DOORBELL_BINARY STATION_URL TOKEN
"""

import asyncio
import json
import subprocess
import sys
import uuid

import httpx
from google.protobuf import json_format

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError

BINARY, BASE, TOKEN = sys.argv[1:4]


def doorbell(*args):
    ran = subprocess.run([BINARY, *args], capture_output=True, text=True, check=False)
    if ran.returncode != 0:
        raise RuntimeError(f"doorbell {' '.join(args)}: {ran.returncode} {ran.stderr}")
    return ran.stdout


async def answer(task_id, state, text, *extra):
    """The station answers, as its agent would."""
    await asyncio.to_thread(
        doorbell, "reply", task_id, "--from", "web", "--state", state, *extra, text
    )


def message(text, task_id=None):
    m = pb.Message(
        message_id=str(uuid.uuid4()),
        role=pb.ROLE_USER,
        parts=[pb.Part(text=text)],
    )
    if task_id:
        m.task_id = task_id
    return pb.SendMessageRequest(message=m)


def state(status):
    return pb.TaskState.Name(status.state)


def texts(task):
    return [p.text for m in task.history for p in m.parts if p.text]


def event(ev):
    kind = ev.WhichOneof("payload")
    if kind == "task":
        return {"kind": "task", "state": state(ev.task.status), "history": texts(ev.task)}
    if kind == "status_update":
        update = ev.status_update
        said = [p.text for p in update.status.message.parts if p.text]
        return {"kind": "status", "state": state(update.status), "text": said}
    if kind == "artifact_update":
        data = [json_format.MessageToDict(p.data) for p in ev.artifact_update.artifact.parts]
        return {"kind": "artifact", "data": data}
    return {"kind": kind}


async def raw(http, method, params):
    """A JSON-RPC call without the SDK, its result parsed with the SDK's protobuf types,
    unknown fields not ignored."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    reply = await http.post(BASE, json=body, headers={"A2A-Version": "1.0"})
    reply.raise_for_status()
    return reply.json()


async def main():
    seen = {}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        card_json = (await http.get(f"{BASE}/.well-known/agent-card.json")).json()
        json_format.ParseDict(card_json, pb.AgentCard())
        card = await A2ACardResolver(http, BASE).get_agent_card()
        seen["card"] = {
            "name": card.name,
            "streaming": card.capabilities.streaming,
            "skills": [s.id for s in card.skills],
            "url": card.supported_interfaces[0].url,
            "version": card.supported_interfaces[0].protocol_version,
        }
        polling = ClientFactory(
            ClientConfig(httpx_client=http, streaming=False, polling=True)
        ).create(card)
        streaming = ClientFactory(ClientConfig(httpx_client=http)).create(card)

        # A message becomes a request in web's inbox, and a debt.
        sent = [e async for e in polling.send_message(message("ETA for the footer?"))]
        first = sent[0].task
        seen["sent"] = {"id": first.id, "state": state(first.status), "history": texts(first)}
        seen["debts"] = json.loads(await asyncio.to_thread(doorbell, "debts", "--json"))
        got = await polling.get_task(pb.GetTaskRequest(id=first.id))
        seen["got"] = {"id": got.id, "context": got.context_id, "state": state(got.status)}

        # Streamed while web answers working, then completed with a data part.
        events = []
        async for ev in streaming.send_message(message("And the header?")):
            events.append(event(ev))
            if ev.HasField("task"):
                second = ev.task.id
                await answer(second, "working", "on it")
            elif ev.HasField("status_update") and ev.status_update.status.state == pb.TASK_STATE_WORKING:
                await answer(second, "completed", "Friday", "--data", '{"eta":"Friday"}')
        seen["streamed"] = events

        # A stream left early, then resumed: nothing said meanwhile is lost.
        stream = streaming.send_message(message("Which font?"))
        async for ev in stream:
            third = ev.task.id
            break
        await stream.aclose()
        await answer(third, "working", "looking")
        resumed = []
        async for ev in streaming.subscribe(pb.SubscribeToTaskRequest(id=third)):
            resumed.append(event(ev))
            if ev.HasField("task"):
                await answer(third, "input-required", "serif or sans?")
        seen["resumed"] = resumed
        # The input it asked for: a message naming the task is the requester's working.
        input_given = [e async for e in polling.send_message(message("sans", task_id=third))]
        seen["input"] = state(input_given[0].task.status)
        await answer(third, "completed", "sans it is")

        listed = await polling.list_tasks(pb.ListTasksRequest())
        seen["listed"] = sorted(t.id for t in listed.tasks)
        seen["total"] = listed.total_size
        done = await polling.list_tasks(pb.ListTasksRequest(status=pb.TASK_STATE_COMPLETED))
        seen["completed"] = sorted(t.id for t in done.tasks)
        page = await polling.list_tasks(pb.ListTasksRequest(page_size=2))
        rest = await polling.list_tasks(
            pb.ListTasksRequest(page_size=2, page_token=page.next_page_token)
        )
        seen["pages"] = [len(page.tasks), len(rest.tasks), rest.next_page_token]

        canceled = await polling.cancel_task(pb.CancelTaskRequest(id=first.id))
        seen["canceled"] = state(canceled.status)
        try:
            await polling.cancel_task(pb.CancelTaskRequest(id=first.id))
            seen["cancel_again"] = "no error"
        except TaskNotCancelableError as e:
            seen["cancel_again"] = "TaskNotCancelableError"
        try:
            await polling.get_task(pb.GetTaskRequest(id="no-such-task"))
            seen["unknown"] = "no error"
        except TaskNotFoundError:
            seen["unknown"] = "TaskNotFoundError"

        # The raw results, parsed strictly by the SDK's protobuf types.
        for method, params, kind in [
            ("GetTask", {"id": second}, pb.Task),
            ("ListTasks", {"historyLength": 5, "includeArtifacts": True}, pb.ListTasksResponse),
        ]:
            result = (await raw(http, method, params))["result"]
            json_format.ParseDict(result, kind())
        task = (await raw(http, "GetTask", {"id": second}))["result"]
        seen["raw_state"] = task["status"]["state"]
        seen["raw_artifacts"] = task.get("artifacts", [])
        seen["raw_roles"] = [m["role"] for m in task["history"]]
    print(json.dumps(seen))


asyncio.run(main())
