import pytest

import gen_durable as gd
from gen_durable.testing import assert_awaiting, assert_done, drain


class Approval(gd.Machine):
    name = "tests.smoke.Approval"

    @gd.step
    def start(self, ctx):
        return gd.Await(["approve", "reject"], next="decide")

    @gd.step
    def decide(self, ctx):
        return gd.Done({"decision": ctx.awaited[0].name, "by": ctx.awaited[0].payload})


class Fan(gd.Machine):
    name = "tests.smoke.Fan"

    @gd.step
    def start(self, ctx):
        return gd.ScheduleChildren(next="join", children=[gd.Child(Approval2, state={"i": i}) for i in range(3)])

    @gd.step
    def join(self, ctx):
        return gd.Done({"children": len(ctx.children), "done": sum(c.status == "done" for c in ctx.children)})


class Approval2(gd.Machine):
    name = "tests.smoke.Kid"

    @gd.step
    def start(self, ctx):
        return gd.Done({"i": ctx.state["i"]})


@pytest.mark.django_db
def test_await_signal_and_fanout_via_drain(django_assert_num_queries):
    id_ = gd.insert(Approval, correlation_key="ap-1")
    assert drain()["await"] == 1
    assert_awaiting(id_, ["approve"])
    with django_assert_num_queries(1):
        sid = gd.signal("ap-1", "reject", {"who": "ann"})
    assert isinstance(sid, int)
    drain()
    assert_done(id_, {"decision": "reject", "by": {"who": "ann"}})
    with pytest.raises(gd.NoTarget):
        gd.signal(id_, "approve")
    fan = gd.insert(Fan)
    tally = drain()
    assert tally["schedule_children"] == 1 and tally["done"] == 4
    assert_done(fan, {"children": 3, "done": 3})
    snap = gd.get(fan)
    assert snap.status == "done" and snap.children_pending == 0
    assert gd.await_result(fan, 0).status == "done"
