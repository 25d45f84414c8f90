-- worker_unregister: a worker process stopping removes its registry row. Params: id text.
DELETE FROM gen_durable_workers WHERE id = %(id)s::text
