"""tau-bench results (``results/*.json`` written by ``tau_bench/run.py``): a JSON array of records
``{"task_id", "trial", "reward", "info", "traj"}``, ``traj`` the OpenAI chat messages of one
conversation (system policy, simulated user, assistant with ``tool_calls``, ``tool`` results).

Kinds by the shared message rule (app/ingest/_chat.py); ``reward`` is the outcome; the trials of one
``task_id`` form a group; ``info.reward_info.info`` scalars (``r_actions``, ``r_outputs``) and the
record's scalars go to meta. A record with an empty ``traj`` (a run that failed, its error in
``info.error``) is a 422 naming it.
"""

from __future__ import annotations

from app.core.schemas import EpisodeIn
from app.ingest._chat import chat_episode, no_messages, record_meta, render_messages
from app.ingest._common import Record, scalar_meta, sub_object
from app.ingest._document import Document
from app.ingest._registry import register_format
from app.ingest._spans import SpanBuilder

NAME = "tau_bench"


def sniff(doc: Document) -> bool:
    first = doc.first
    return isinstance(first, dict) and isinstance(first.get("traj"), list) and "task_id" in first


def episode_from_record(rec: Record) -> EpisodeIn:
    obj = rec.obj
    if not isinstance(obj, dict) or not isinstance(obj.get("traj"), list):
        raise rec.error("missing_field", "field `traj` (a list of chat messages) is missing.", field="traj")
    info = sub_object(obj, "info")
    if not obj["traj"]:
        err = info.get("error")
        raise no_messages(rec, "traj", f" (the run failed: {str(err)[:200]})" if err else "")
    b = SpanBuilder()
    render_messages(b, obj["traj"], rec, "traj")
    meta = record_meta(obj, {"reward", "traj", "info"}, f"upload:{NAME}")
    reward_info = info.get("reward_info")
    if isinstance(reward_info, dict) and isinstance(reward_info.get("info"), dict):
        meta.update(scalar_meta(reward_info["info"], set()))
    task = info.get("task")
    if isinstance(task, dict) and isinstance(task.get("user_id"), str):
        meta["user_id"] = task["user_id"]
    meta.setdefault("task", f"task {obj.get('task_id')}")
    return chat_episode(
        b, rec, reward=obj.get("reward"), reward_field="reward", group=obj.get("task_id"), meta=meta
    )


register_format(
    name=NAME,
    description="tau-bench results (task_id, trial, reward, info, traj of chat messages)",
    priority=22,
    sniff=sniff,
    record=episode_from_record,
)
