"""Inline continuation's configuration: the INLINE setting (check E014), the machine
attribute and Next(inline=) — each rejected with a clear error when malformed."""

import pytest
from django.core.checks import Error
from django.test import override_settings

import gen_durable as gd
from gen_durable import checks, conf
from gen_durable.exceptions import InvalidInput


def E014(msg, hint):
    return Error(msg, hint=hint, id="gen_durable.E014")


def test_default_bound_merges_partial_settings():
    assert conf.DEFAULTS["INLINE"] == {"MAX_STEPS": 100, "MAX_SECONDS": 10}
    with override_settings(GEN_DURABLE={"INLINE": {"MAX_STEPS": 5}}):
        assert conf.get_settings().INLINE == {"MAX_STEPS": 5, "MAX_SECONDS": 10}
        assert checks.check_inline() == []


@pytest.mark.parametrize("value, expected", [
    ({"MAX_STEPS": 0}, [E014("GEN_DURABLE['INLINE']['MAX_STEPS'] must be an int >= 1, got 0.",
                             "Steps an inline chain runs before it yields back to the pick; 1 turns chaining off.")]),
    ({"MAX_STEPS": 2.5}, [E014("GEN_DURABLE['INLINE']['MAX_STEPS'] must be an int >= 1, got 2.5.",
                               "Steps an inline chain runs before it yields back to the pick; 1 turns chaining off.")]),
    ({"MAX_SECONDS": 0}, [E014("GEN_DURABLE['INLINE']['MAX_SECONDS'] must be seconds > 0, got 0.",
                               "Time after which an inline chain yields back to the pick.")]),
    ({"MAX_STEP": 3}, [E014("GEN_DURABLE['INLINE'] has an unknown key 'MAX_STEP'.", "Did you mean 'MAX_STEPS'?")]),
    (False, [E014("GEN_DURABLE['INLINE'] must be a dict, got False.",
                  'For example {"MAX_STEPS": 100, "MAX_SECONDS": 10}.')]),
])
def test_bad_inline_settings_are_named(value, expected):
    with override_settings(GEN_DURABLE={"INLINE": value}):
        assert checks.check_inline() == expected


def test_check_is_registered():
    from django.core.checks import registry

    assert checks.check_inline in registry.registry.get_checks()


def test_inline_execution_must_be_a_bool():
    with pytest.raises(InvalidInput, match="inline_execution must be True or False, got 'yes'"):
        class Bad(gd.Machine):
            name = "tests.BadInline"
            inline_execution = "yes"

            @gd.step
            def start(self, ctx):
                return gd.Done()


def test_next_inline_must_be_none_or_a_bool():
    assert gd.Next("b", inline=True).inline is True
    with pytest.raises(InvalidInput, match="Next inline must be None"):
        gd.Next("b", inline=1)
