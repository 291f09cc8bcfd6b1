"""GitHub webhooks: `receiver.py` (serve: verify, de-duplicate, queue) and `worker.py` (the
poller leader: apply queued deliveries); `payloads.py` is what both read of a delivery."""
