
import gen_durable as gd
from gen_durable.models import Instance
from tests.conftest import wait_until
from tests.durable_app.durable import Counter


def test_engine_runs_counters_to_done(engine, queue_name):
    ids = gd.insert_all([gd.Spec(Counter, state={"target": 3}, queue=queue_name) for _ in range(50)])
    engine({queue_name: 4})
    wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == 50, what="50 done")
    assert {r.result["count"] for r in Instance.objects.filter(id__in=ids)} == {3}
