"""GitHub webhooks, serve's side: `receiver.py` (verify the signature, refuse what is not
ours, de-duplicate, queue for the leader) and `payloads.py` (what a delivery must carry, read
by the receiver and by the leader's `leader/deliveries.py`)."""
