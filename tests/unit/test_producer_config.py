"""GEN_DURABLE['PRODUCER'] (gd.insert_async's buffer) and its check E015."""

import pytest
from django.core.checks import Error
from django.test import override_settings

from gen_durable import checks, conf


def E015(msg, hint):
    return Error(msg, hint=hint, id="gen_durable.E015")


def test_defaults_merge_and_pass():
    with override_settings(GEN_DURABLE={"PRODUCER": {"MAX_BATCH": 500}}):
        assert conf.get_settings().PRODUCER == {"MAX_BATCH": 500, "MAX_DELAY": 0.1, "MAX_BUFFER": 10000,
                                                "ON_ERROR": None}
        assert checks.check_producer() == []


@pytest.mark.parametrize("value, expected", [
    ({"MAX_BATCH": 0}, [E015("GEN_DURABLE['PRODUCER']['MAX_BATCH'] must be an int >= 1, got 0.",
                             "Rows per insert_all (MAX_BATCH) / rows queued at most (MAX_BUFFER).")]),
    ({"MAX_DELAY": -1}, [E015("GEN_DURABLE['PRODUCER']['MAX_DELAY'] must be seconds >= 0, got -1.",
                              "How long a queued row may wait for its batch to fill.")]),
    ({"MAX_BUFFER": 10}, [E015("GEN_DURABLE['PRODUCER']['MAX_BUFFER'] is below MAX_BATCH.",
                               "The queue must hold at least one batch.")]),
    ({"MAX_BATH": 10}, [E015("GEN_DURABLE['PRODUCER'] has an unknown key 'MAX_BATH'.", "Did you mean 'MAX_BATCH'?")]),
    ({"ON_ERROR": "no.such.module.fn"}, [E015(
        "GEN_DURABLE['PRODUCER']['ON_ERROR'] cannot be used: No module named 'no'.",
        "A dotted path to a function on_error(error, specs), or None.")]),
    ({"ON_ERROR": "gen_durable.conf.DEFAULTS"}, [E015(
        "GEN_DURABLE['PRODUCER']['ON_ERROR'] cannot be used: it is not a dotted path to a callable.",
        "A dotted path to a function on_error(error, specs), or None.")]),
    (7, [E015("GEN_DURABLE['PRODUCER'] must be a dict, got 7.", 'For example {"MAX_BATCH": 1000, "MAX_DELAY": 0.1}.')]),
])
def test_bad_producer_settings_are_named(value, expected):
    with override_settings(GEN_DURABLE={"PRODUCER": value}):
        assert checks.check_producer() == expected
