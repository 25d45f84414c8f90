"""The stable import path of the Django Tasks backend: `gen_durable.tasks` is `gen_durable.integrations.tasks`
(the same module object, so settings that name `gen_durable.tasks.…` — `TASKS[…]["BACKEND"]` — keep working)."""

import sys

from .integrations import tasks as _module

sys.modules[__name__] = _module
