"""`github-broker sandbox`: the whole broker offline, for trying it and for developing agents.

`cli.py` (its command line, event log and banner), `world.py` (the simulator, the broker on
offline settings, the demo agents), `servers.py` (the API under uvicorn, the in-process
store on a loopback port), `watch.py` (the event log's watchers), `summary.py` (what is left
when the agents have nothing to take, and who moves it), `maintainer.py` (the simulated
maintainer), `state.py` (the file where a running sandbox says how to reach it).
"""
