"""A job resumes every node from the same step or none: each node's step is read from its
keeper's resume plan as a typed record, and a plan of another shape names no step (never a
traceback)."""

from __future__ import annotations

from trainroom.core.job.actions import JobAction, NodeAction, _resume_refusal
from trainroom.core.wire import protocol as p


def _node(rank: int, plan: dict[str, object]) -> NodeAction:
    reply = p.Reply(id=1, action="resume", stage="plan", plan=plan)
    return NodeAction(node=f"n{rank}", node_rank=rank, host=f"h{rank}", address=None, plan=reply)


def test_nodes_resume_from_one_step_or_the_refusal_names_the_node_that_lacks_it() -> None:
    same = JobAction("resume", [_node(0, {"attempt": 2, "step": 300}), _node(1, {"attempt": 2, "step": 300})])
    assert _resume_refusal(same) is None
    apart = JobAction(
        "resume", [_node(0, {"attempt": 2, "step": 300}), _node(1, {"attempt": 2, "step": 200})]
    )
    assert _resume_refusal(apart) == (
        "resume refused: the nodes' verified steps differ: node 1 (h1) lacks step 300 (its newest verified is 200)"
    )
    # A plan this code cannot read (another version's keeper): no step, said as none.
    odd = JobAction("resume", [_node(0, {"step": 300}), _node(1, {"step": "three hundred"})])
    assert _resume_refusal(odd) == (
        "resume refused: the nodes' verified steps differ: node 1 (h1) lacks step 300 (its newest verified is none)"
    )
