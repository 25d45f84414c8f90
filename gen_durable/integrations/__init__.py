"""What gen_durable plugs into, apart from the engine: Django's Tasks framework
(`tasks`: the `GenDurableBackend`) and OpenTelemetry (`otel`: spans and metrics from the
telemetry events). Their stable import paths are `gen_durable.tasks` and `gen_durable.otel`."""
