import pytest

import gen_durable as gd
from gen_durable.testing import assert_done, drain
from tests.durable_app.durable import Counter

pytestmark = pytest.mark.django_db


def test_counter_runs_to_done_through_drain():
    id_ = gd.insert(Counter, state={"target": 3})
    tally = drain()
    assert tally["steps"] == 3 and tally["next"] == 2 and tally["done"] == 1
    assert_done(id_, {"count": 3})
