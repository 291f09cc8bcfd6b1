"""serve's processes: the supervisor (`supervisor.py`), the API workers (`api_worker.py`) and
the poller (`poller.py`); `serve.py` puts them together for `github-broker serve`."""
