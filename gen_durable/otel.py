"""The stable import path of the OpenTelemetry integration: `gen_durable.otel` is `gen_durable.integrations.otel`
(the same module object, so settings that name `gen_durable.otel.…` and calls of `gen_durable.otel.install` keep working)."""

import sys

from .integrations import otel as _module

sys.modules[__name__] = _module
