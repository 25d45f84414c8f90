"""Machines of two "releases" for the rolling-deploy tests (tests/integration/test_deploys.py).

A worker subprocess started with GEN_DURABLE_TEST_RELEASE=old is the release before the
deploy: it lacks `tests.deploy.Added`, version 2 of `tests.deploy.Evolving` and the step
`pack` of its version 1. Every other process (the test process, a worker without the
variable) is the new release. Each step records which release ran it.
"""

import os

import gen_durable as gd

RELEASE = os.environ.get("GEN_DURABLE_TEST_RELEASE", "new")


def _ran(ctx, step):
    return {**ctx.state, "ran": [*ctx.state.get("ran", []), f"{step}@{RELEASE}"]}


class Both(gd.Machine):
    """In both releases."""

    name = "tests.deploy.Both"

    @gd.step
    def start(self, ctx):
        return gd.Done(_ran(ctx, "start"))


if RELEASE == "old":
    class Evolving(gd.Machine):
        name = "tests.deploy.Evolving"

        @gd.step
        def start(self, ctx):
            return gd.Done(_ran(ctx, "start"))
else:
    class Added(gd.Machine):
        """New in this release."""

        name = "tests.deploy.Added"

        @gd.step
        def start(self, ctx):
            return gd.Done(_ran(ctx, "start"))

    class Evolving(gd.Machine):  # noqa: F811  (version 1 gains a step)
        name = "tests.deploy.Evolving"

        @gd.step
        def start(self, ctx):
            return gd.Done(_ran(ctx, "start"))

        @gd.step
        def pack(self, ctx):
            return gd.Done(_ran(ctx, "pack"))

    class EvolvingV2(gd.Machine):
        name = "tests.deploy.Evolving"
        version = 2

        @gd.step
        def start(self, ctx):
            return gd.Done(_ran(ctx, "start"))
