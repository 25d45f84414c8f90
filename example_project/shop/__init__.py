"""The example shop: durable order flow, receipts and a throughput pipeline (durable.py)."""
